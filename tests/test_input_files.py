"""What a user's tree or acceptance file says is what Bole reads (bole_cli/files.py,
bole_cli/calibrate/acceptance.py): YAML numbers as YAML 1.2 and JSON write them (1e-3 is a
number), no key given twice (the parsers kept the last silently), and no unknown key in an
acceptance file (a misspelt rank_factor left the default in force). Each is one line, exit 2.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from bole_cli import cli, files
from bole_cli.calibrate import acceptance as acc
from bole_cli.errors import InputError

try:  # click < 8.2 mixes stderr into stdout unless told not to
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()

REPO = Path(__file__).resolve().parents[1]
PROFILES = sorted(REPO.glob("profiles/*/Qwen*.yaml"))


def invoke(tmp_path: Path, *args: str):
    return runner.invoke(cli.app, list(args), env={"BOLE_CACHE_DIR": str(tmp_path / "cache")})


def one_error(r) -> str:
    """The single stderr line of a refused input (exit 2, no traceback)."""
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2, (r.exit_code, r.stderr, r.stdout)
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def write(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


# ---- 1. YAML numbers as YAML 1.2 reads them -----------------------------------------------
# text -> value: the exponent forms PyYAML's YAML 1.1 resolver left as strings, and around
# them what must read as before (integers stay ints, '09' and '0o10' stay strings)
NUMBERS = {
    "1e-3": 1e-3, "-1E+5": -1e5, "5e-1": 0.5, "1.0e3": 1000.0, "1e3": 1000.0, "+.5e-3": 5e-4,
    "-.5": -0.5, "1.0e-3": 1e-3, "0.5": 0.5, "1.": 1.0, ".5": 0.5,
    "12": 12, "-3": -3, "1_000": 1000, "0x10": 16, "010": 8, "1:20": 80,
    "09": "09", "0o10": "0o10", "1e": "1e", "e3": "e3", "1_0e3": "1_0e3", "Inf": "Inf",
}


def test_yaml_reads_numbers_as_yaml_1_2():
    got = {text: files.parse_yaml(text, "n.yaml") for text in NUMBERS}
    assert got == NUMBERS
    assert all(type(got[t]) is type(v) for t, v in NUMBERS.items())  # 12 an int, not 12.0
    for text, check in ((".inf", math.isinf), ("-.inf", math.isinf), (".nan", math.isnan)):
        assert check(files.parse_yaml(text, "n.yaml"))


def test_the_global_safe_loader_is_not_changed():
    """Bole's loader has its own resolver table: yaml.safe_load elsewhere (SGLang, a user's
    plug-in) must keep YAML 1.1's reading."""
    tables = [(cls, {ch: list(rs) for ch, rs in cls.yaml_implicit_resolvers.items()})
              for cls in (yaml.SafeLoader, getattr(yaml, "CSafeLoader", yaml.SafeLoader))]
    assert files.parse_yaml("[1e-3, 5e-1]", "n.yaml") == [1e-3, 0.5]
    assert yaml.safe_load("[1e-3, 5e-1]") == ["1e-3", "5e-1"]
    for cls, before in tables:
        assert cls.yaml_implicit_resolvers == before, cls


def test_a_tree_file_with_exponents(tmp_path):
    path = write(tmp_path, "sci.yaml", "parents: [-1, 0, 0]\nprobs: [1.0, 1e-3, 0.5]\n")
    r = invoke(tmp_path, "inspect-tree", path, "--json")
    assert r.exit_code == 0, r.stderr


def test_an_acceptance_file_with_exponents(tmp_path):
    path = write(tmp_path, "acc.yaml", "per_depth: [0.8, 0.7, 0.6, 5e-1]\n")
    model = acc.load_acceptance(path)
    assert [row[0] for row in model.q] == pytest.approx([0.8, 0.7, 0.6, 0.5])


# ---- 2. a key given twice -----------------------------------------------------------------
@pytest.mark.parametrize("name, text", [
    ("t.json", '{"parents": [-1, 0, 0], "probs": [1, 0.5, 0.4], "probs": [1, 0.9, 0.9]}'),
    ("t.yaml", "parents: [-1, 0, 0]\nprobs: [1, 0.5, 0.4]\nprobs: [1, 0.9, 0.9]\n"),
])
def test_a_tree_file_with_a_key_twice(tmp_path, name, text):
    line = one_error(invoke(tmp_path, "inspect-tree", write(tmp_path, name, text)))
    where = "" if name.endswith(".json") else "line 3: "
    assert line.endswith(f"{name}: {where}key 'probs' appears twice"), line


@pytest.mark.parametrize("name, text, where", [
    ("a.json", '{"per_depth": [0.8, 0.7], "per_depth": [0.9]}', ""),
    ("a.yaml", "per_depth: [0.8, 0.7]\nper_depth: [0.9]\n", "line 2: "),
])
def test_an_acceptance_file_with_a_key_twice(tmp_path, name, text, where):
    with pytest.raises(InputError) as info:
        acc.load_acceptance(write(tmp_path, name, text))
    assert str(info.value) == (f"--acceptance: {tmp_path / name}: {where}key 'per_depth' "
                               "appears twice")


def test_a_key_twice_at_any_depth():
    with pytest.raises(InputError, match=r"^x.json: key 'c' appears twice$"):
        files.parse_json('{"a": [1, {"b": {"c": 1, "c": 2}}]}', "x.json")
    with pytest.raises(InputError, match=r"^x.yaml: line 3: key 'c' appears twice$"):
        files.parse_yaml("a:\n  - b: {c: 1,\n        c: 2}\n", "x.yaml")
    with pytest.raises(InputError, match="key 1.0 appears twice"):  # equal keys, as Python sees
        files.parse_yaml("{1: a, 1.0: b}", "x.yaml")
    # the same key in two mappings is no repeat
    assert files.parse_json('[{"a": 1}, {"a": 1}]', "x.json") == [{"a": 1}, {"a": 1}]


def test_yaml_merge_keys_still_merge():
    """`<<` brings in an anchored mapping's keys and a key written beside it overrides one
    (YAML's rule, not a repeat); a key written twice beside it is one."""
    base = "base: &b {p: 1, q: 2}\n"
    assert files.parse_yaml(base + "x: {<<: *b, q: 3}\n", "m.yaml")["x"] == {"p": 1, "q": 3}
    assert files.parse_yaml(base + "x: {<<: [*b, {r: 4}]}\n", "m.yaml")["x"] == {
        "p": 1, "q": 2, "r": 4}
    with pytest.raises(InputError, match=r"^m.yaml: line 2: key 'q' appears twice$"):
        files.parse_yaml(base + "x: {<<: *b, q: 3, q: 4}\n", "m.yaml")


# ---- 3. an acceptance file's unknown key --------------------------------------------------
def test_a_misspelt_acceptance_key_is_refused_on_the_command_line(tmp_path):
    path = write(tmp_path, "typo.json",
                 '{"per_depth": [0.9, 0.8, 0.7], "rank_factr": 0.9}')
    line = one_error(invoke(tmp_path, "calibrate", "--gpu", "h200", "--model", "9b",
                            "--batch", "1", "--kv", "1024", "--acceptance", path, "--json"))
    assert f"--acceptance: {path}: unknown field 'rank_factr' (did you mean 'rank_factor'?); " \
           "expected name, per_depth" in line, line


def _measured_document() -> dict:
    """An acceptance file as `bole acceptance` writes it (bole_cli/mtp/run.py's _finish)."""
    counts, trials = [[8, 1], [5, 1]], [10, 8]
    measurement = {
        "method": "teacher-forced MTP drafts", "checkpoint": "/models/x", "model_type": "qwen3_5",
        "prompts": {"file": "p.jsonl", "sha256": "0" * 64, "count": 2, "used": 2},
        "max_new": 12, "depth": 2, "device": "cpu", "dtype": "float32",
        "versions": {"bole": "0"}, "date": "2026-01-01T00:00:00", "command": "bole acceptance",
        "partial": False, "anchors": 10, "generated_tokens": 24,
        "interval": {"level": 0.95, "z": 1.96, "method": "wilson",
                     "lower": [[0.5, 0.0], [0.3, 0.0]], "upper": [[0.9, 0.4], [0.9, 0.5]]},
        "chain": {"trials": [10, 8], "hits": [8, 5], "committed": 2.3},
    }
    doc = acc.measured_document("x on p.jsonl", counts, trials, measurement)
    doc["expected"] = {"chain": 2.3, "chain_measured": 2.3, "trees": {"2": 1.8}}
    return doc


def _histogram_document() -> dict:
    return {"name": "observed", "accepted_length_histogram": {"counts": [20, 30, 50]},
            "speculative": {"num_steps": 2, "topk": 1, "num_draft_tokens": 3},
            "extrapolate_to": 4, "interval_level": 0.9}


LEGITIMATE = {
    "per_depth": lambda: {"name": "mine", "per_depth": [0.8, 0.7], "top_k": 2, "rank_factor": 0.4},
    "per_depth_rank": lambda: {"per_depth_rank": [[0.5, 0.3], [0.4, 0.2]]},
    "curve": lambda: {"curve": {"n": [1, 8], "e_acc": [1, 3]}},
    "measured": _measured_document,
    "histogram": _histogram_document,
    "describe": lambda: {**acc.preset("paper-mbpp").describe(), "measured": {"what": "x"}},
    **{f"profile-{p.parent.name}-{p.stem}":
       (lambda p=p: yaml.safe_load(p.read_text())["acceptance"]) for p in PROFILES},
}


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
@pytest.mark.parametrize("kind", sorted(LEGITIMATE))
def test_every_acceptance_file_loads_and_a_typo_in_it_is_refused(tmp_path, kind, suffix):
    """Each kind of file Bole writes or reads (a measured file with its provenance, an
    observed histogram, a profile's acceptance block, the shipped profiles') still loads;
    the same file with one misspelt key does not."""
    doc = LEGITIMATE[kind]()
    good = tmp_path / f"good{suffix}"
    good.write_text(json.dumps(doc) if suffix == ".json" else yaml.safe_dump(doc, sort_keys=False))
    acc.load_acceptance(str(good))
    typo = tmp_path / f"typo{suffix}"
    doc["interval_levle"] = 0.9
    typo.write_text(json.dumps(doc) if suffix == ".json" else yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(InputError, match=r"unknown field 'interval_levle' \(did you mean "
                                         r"'interval_level'\?\); expected name, per_depth"):
        acc.load_acceptance(str(typo))


def test_an_unknown_key_with_no_near_name():
    with pytest.raises(InputError, match=r"^a.yaml: unknown field 'zzz'; expected name, "):
        acc.from_data({"per_depth": [0.9], "zzz": 1}, "a.yaml")


def test_a_byte_order_mark_is_not_part_of_the_text(tmp_path):
    """Windows editors save UTF-8 with a byte-order mark; JSON and YAML read through it."""
    from bole_cli.files import load_structured

    for name, text in (("t.json", '{"parents": [-1, 0]}'), ("t.yaml", "parents: [-1, 0]\n")):
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert load_structured(path) == {"parents": [-1, 0]}


def test_a_tag_that_is_a_file_name_is_refused():
    from bole_cli.bench.results import check_tag

    with pytest.raises(InputError, match=r"--tag: 'x.json' is a file name; give its stem"):
        check_tag("x.json")
    assert check_tag("x.v2") == "x.v2"


@pytest.mark.parametrize("text", ["5e2", "-.5", "1E-3", "1_000", "0x10", "1:20", "yes", "null", "09", ".inf"])
def test_what_bole_writes_as_yaml_reads_back_the_same(text):
    """A string that YAML 1.2 reads as a number (an acceptance file named 5e2.yaml gives a
    profile the name '5e2') is quoted by the writer, so Bole reads its own files back."""
    data = {"name": text, "rows": [[0.5, 1e-3], [text]]}
    assert files.parse_yaml(files.dump_yaml(data, sort_keys=False), "x.yaml") == data


def test_a_checkpoints_config_with_a_repeated_key_reads_as_its_tools_read_it(tmp_path):
    """transformers and SGLang keep a repeated key's last value in a checkpoint's config.json;
    `bole models` reads the same model, not an error."""
    from bole_cli.catalog.models import load_hf_config

    text = (Path(__file__).parent / "data" / "configs" / "qwen3_5_9b.json").read_text()
    assert text.lstrip().startswith("{")
    (tmp_path / "config.json").write_text('{"model_type": "llama", ' + text.lstrip()[1:])
    assert load_hf_config(tmp_path).vocab == load_hf_config(Path(__file__).parent / "data" / "configs"
                                                           / "qwen3_5_9b.json").vocab
    with pytest.raises(InputError, match="key 'model_type' appears twice"):
        files.parse_json((tmp_path / "config.json").read_text(), "t.json")


@pytest.mark.parametrize("given", [{"per_depth_rank": [[0.8, 0.1], [0.7, 0.1]]},
                                   {"curve": {"n": [1, 8, 32], "e_acc": [1.0, 3.0, 4.0]}}])
def test_a_rank_factor_that_would_do_nothing_is_refused(given):
    """rank_factor spreads per_depth over the ranks; beside per_depth_rank or a curve it would
    be ignored without a word."""
    acc.from_data(given, "a.json")
    with pytest.raises(InputError, match="a.json: rank_factor: not read with"):
        acc.from_data({**given, "rank_factor": 0.9}, "a.json")


def test_an_empty_tree_file_is_called_empty(tmp_path):
    (tmp_path / "t.yaml").write_text("  \n\n")
    r = CliRunner().invoke(cli.app, ["inspect-tree", str(tmp_path / "t.yaml")])
    assert r.exit_code == 2 and "expected a tree (mapping) or a list of trees, got an empty file" in r.output
