"""`bole acceptance` (issue 19): the MTP loader, teacher-forced acceptance q[d][r], the
acceptance file, on tiny Qwen3-Next / Qwen3.5 checkpoints written here with transformers
(hidden 32, 4 layers, vocab 100) and MTP weights written beside them.

The checks: the MTP head is the checkpoint's layer run as SGLang wires it (against
transformers' own one-layer model); with the draft replaced by the target's own
predictions acceptance is 1.0 at every depth; a random head is right about 1/vocab of the
time; the matrix predicts, within sampling error, what a plain greedy chain-speculation
loop (draft with the MTP head, verify with the target), written independently below,
accepts on the same model.
"""

from __future__ import annotations

import copy
import math
import string
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from bole_cli.calibrate.acceptance import from_data, load_acceptance  # noqa: E402
from bole_cli.errors import InputError  # noqa: E402
from bole_cli.mtp import checkpoint as ckpt_mod  # noqa: E402
from bole_cli.mtp.head import build_head, causal_mask  # noqa: E402
from bole_cli.mtp.measure import MISS, greedy_continuation, teacher_forced_ranks  # noqa: E402
from bole_cli.mtp.run import AcceptanceOptions, run_acceptance  # noqa: E402
from bole_cli.mtp.stats import RankTally  # noqa: E402
from bole_cli.stats import wilson  # noqa: E402

VOCAB = 100
PROMPTS = ["Hello world", "the quick brown fox", "jumps over it", "a lazy dog 123",
           "speculative decoding", "tree verify", "gated delta net", "qwen three"]


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: one thread is several times faster than two on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---- tiny checkpoints ----------------------------------------------------------------------
def tiny_config(kind: str, init: float = 0.02):
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                  linear_value_head_dim=8, max_position_embeddings=512, initializer_range=init,
                  eos_token_id=1)
    if kind == "qwen3_next":
        from transformers import Qwen3NextConfig

        return Qwen3NextConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                               shared_expert_intermediate_size=16, **common)
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config

    return Qwen3_5Config(text_config=common, vision_config=dict(
        depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=32))


def write_tokenizer(directory: Path) -> None:
    """A character-level tokenizer of VOCAB entries (no hub, no training)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.printable if c not in "\t\n\r\x0b\x0c"][:VOCAB - 2]
    vocab = {"<unk>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                            eos_token="<eos>").save_pretrained(directory)


def random_mtp_tensors(cfg, init: float) -> dict:
    """`mtp.*` tensors in the checkpoints' naming: the layer of a one-layer full-attention
    model of the same config (saved by transformers, so experts are per-expert tensors as
    in real checkpoints), its final norm, a random fc and the two input norms."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    one = copy.deepcopy(cfg)
    text = getattr(one, "text_config", one)
    text.num_hidden_layers, text.layer_types = 1, ["full_attention"]
    with tempfile.TemporaryDirectory() as tmp:
        AutoModelForCausalLM.from_config(one).save_pretrained(tmp)
        w = load_file(str(Path(tmp) / "model.safetensors"))
    mtp = {"mtp.layers.0." + k[len("model.layers.0."):]: v for k, v in w.items()
           if k.startswith("model.layers.0.")}
    hidden = text.hidden_size
    mtp["mtp.norm.weight"] = w["model.norm.weight"]
    mtp["mtp.fc.weight"] = torch.randn(hidden, 2 * hidden) * init
    mtp["mtp.pre_fc_norm_embedding.weight"] = torch.randn(hidden) * 0.1
    mtp["mtp.pre_fc_norm_hidden.weight"] = torch.randn(hidden) * 0.1
    return mtp


def make_checkpoint(directory: Path, kind: str = "qwen3_next", seed: int = 0,
                    init: float = 0.02, mtp: bool = True, tokenizer: bool = True,
                    index: bool = False, mtp_tensors: dict | None = None) -> Path:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(kind, init)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(directory)
    if mtp:
        tensors = mtp_tensors if mtp_tensors is not None else random_mtp_tensors(cfg, init)
        save_file(tensors, str(directory / "model-mtp.safetensors"))
        if index:  # as real checkpoints ship them: the index names the MTP shard
            import json
            from safetensors import safe_open

            with safe_open(str(directory / "model.safetensors"), "pt") as fh:
                weight_map = {k: "model.safetensors" for k in fh.keys()}
            weight_map.update({k: "model-mtp.safetensors" for k in tensors})
            (directory / "model.safetensors.index.json").write_text(
                json.dumps({"metadata": {}, "weight_map": weight_map}))
    if tokenizer:
        write_tokenizer(directory)
    return directory


def write_prompts(path: Path, prompts=PROMPTS) -> Path:
    import json

    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def load(directory: Path):
    ck = ckpt_mod.inspect_checkpoint(directory)
    target = ckpt_mod.load_target(ck, "cpu", torch.float32)
    head = build_head(target, ckpt_mod.read_mtp_tensors(ck), str(directory))
    return ck, ckpt_mod.load_tokenizer(ck), target, head


@pytest.fixture(scope="module")
def next_ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("next"), "qwen3_next", seed=0)


@pytest.fixture(scope="module")
def q35_ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("q35"), "qwen3_5", seed=1, index=True)


# ---- the loader and the MTP layer ------------------------------------------------------------
@pytest.mark.parametrize("which", ["next_ckpt", "q35_ckpt"])
def test_mtp_head_is_the_checkpoints_layer(which, request):
    """The head = fc over the normed [embedding, hidden], then transformers' own model of
    one full-attention layer whose weights are mtp.layers.0.* and whose final norm is
    mtp.norm: computed here through that model, compared with the head."""
    from transformers import AutoModelForCausalLM

    directory = request.getfixturevalue(which)
    ck, tok, target, head = load(directory)
    tensors = ckpt_mod.read_mtp_tensors(ck)
    assert set(tensors) == {k[4:] for k in ck.mtp_files}  # found every mtp.* tensor
    assert torch.equal(head.fc.weight, tensors["fc.weight"])  # and uses them

    one_cfg = copy.deepcopy(target.config)
    one_cfg.num_hidden_layers, one_cfg.layer_types = 1, ["full_attention"]
    if hasattr(one_cfg, "mlp_only_layers"):
        one_cfg.mlp_only_layers = []
    ref = AutoModelForCausalLM.from_config(one_cfg).eval()
    ref.model.layers[0].load_state_dict(head.layer.state_dict())
    ref.model.norm.load_state_dict(head.norm.state_dict())

    ids = torch.tensor([tok("a prompt for the MTP head")["input_ids"]])
    with torch.no_grad():
        h = target.model(input_ids=ids).last_hidden_state[0]
        got = head(ids[0, 1:], h[:-1], torch.arange(ids.shape[1] - 1))
        emb = target.get_input_embeddings()(ids[0, 1:])
        z = tensors["fc.weight"] @ torch.cat([head.pre_fc_norm_embedding(emb),
                                              head.pre_fc_norm_hidden(h[:-1])], -1).T
        want = ref.model(inputs_embeds=z.T[None]).last_hidden_state[0]
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)


def test_a_multimodal_qwen35_checkpoint_loads_its_language_model(tmp_path):
    """Real Qwen3.5 checkpoints are Qwen3_5ForConditionalGeneration (model_type qwen3_5,
    text_config, model.language_model.* and model.visual.* tensors): the target is its
    language model, with the saved weights, and its MTP layer is found beside it."""
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3_5ForConditionalGeneration

    torch.manual_seed(2)
    cfg = tiny_config("qwen3_5")
    Qwen3_5ForConditionalGeneration(cfg).save_pretrained(tmp_path)
    save_file(random_mtp_tensors(cfg, 0.02), str(tmp_path / "model-mtp.safetensors"))
    write_tokenizer(tmp_path)
    ck, _, target, head = load(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert ck.model_type == "qwen3_5" and any(k.startswith("model.visual.") for k in saved)
    assert torch.equal(target.get_input_embeddings().weight,
                       saved["model.language_model.embed_tokens.weight"])
    assert torch.equal(target.model.layers[0].linear_attn.A_log,
                       saved["model.language_model.layers.0.linear_attn.A_log"])
    assert head.lm_head(torch.zeros(1, 32)).shape == (1, VOCAB)


def test_mtp_layer_mismatch_names_the_tensor(tmp_path, next_ckpt):
    tensors = random_mtp_tensors(tiny_config("qwen3_next"), 0.02)
    del tensors["mtp.layers.0.self_attn.q_norm.weight"]
    d = make_checkpoint(tmp_path / "c", mtp_tensors=tensors)
    ck = ckpt_mod.inspect_checkpoint(d)
    target = ckpt_mod.load_target(ck, "cpu", torch.float32)
    with pytest.raises(InputError, match=r"mtp\.layers\.0\.self_attn\.q_norm\.weight"):
        build_head(target, ckpt_mod.read_mtp_tensors(ck), str(d))
    del tensors["mtp.fc.weight"]
    with pytest.raises(InputError, match=r"missing mtp\.fc\.weight"):
        build_head(target, {k[4:]: v for k, v in tensors.items()}, str(d))


# ---- the measurement -------------------------------------------------------------------------
def _oracle(_depth, _draft, target_logits):
    return target_logits


@pytest.mark.parametrize("which", ["next_ckpt", "q35_ckpt"])
def test_target_as_its_own_draft_is_always_accepted(which, request, tmp_path):
    directory = request.getfixturevalue(which)
    prompts = write_prompts(tmp_path / "p.jsonl", PROMPTS[:3])
    res = run_acceptance(AcceptanceOptions(str(directory), str(prompts), depth=5, topk=3,
                                           max_new=24, device="cpu", out=tmp_path / "a.yaml",
                                           plot=False), predict=_oracle)
    assert res.tally.anchors == 3 * (24 - 5 + 1)
    assert res.model.q == [[1.0, 0.0, 0.0]] * 5
    assert res.tally.trials == [res.tally.anchors] * 5
    assert res.document["expected"]["chain"] == 6.0 == res.tally.chain_committed()
    lo = res.document["measurement"]["interval"]["lower"]
    assert all(0.9 < row[0] < 1.0 for row in lo)  # n = 60 of 60: the interval stays below 1
    assert load_acceptance(str(res.path)).q == res.model.q  # calibrate reads what was written


def test_random_head_is_right_about_one_in_vocab(tmp_path, next_ckpt):
    """The random-weight MTP head (the module checkpoint), and random draft logits: the
    target's token is in the top-k about k / vocab of the time."""
    prompts = write_prompts(tmp_path / "p.jsonl")
    opts = AcceptanceOptions(str(next_ckpt), str(prompts), depth=2, topk=4, max_new=40,
                             device="cpu", out=tmp_path / "a.yaml", plot=False)
    head_run = run_acceptance(opts)
    gen = torch.Generator().manual_seed(0)
    noise = run_acceptance(opts, predict=lambda _d, x, _t: torch.randn(x.shape, generator=gen))
    for res in (head_run, noise):
        n = res.tally.trials[0]
        assert n == len(PROMPTS) * (40 - 2 + 1)
        hits = sum(res.tally.counts[0])
        lo, hi = wilson(hits, n, z=4.0)
        assert lo <= 4 / VOCAB <= hi or hits / n < 3 * 4 / VOCAB, (hits, n)
    # random logits: uniform ranks, so the bound is tight (4 sigma of k / vocab)
    rate = sum(noise.tally.counts[0]) / noise.tally.trials[0]
    assert abs(rate - 4 / VOCAB) < 4 * math.sqrt(4 / VOCAB / noise.tally.trials[0])


def _train_head(target, head, seqs, steps: int = 60) -> None:
    """Fit the MTP's depth-1 prediction to the target's greedy tokens (a few Adam steps):
    a head that is right often but not always, so the chain test has something to count."""
    data = []
    with torch.no_grad():
        for seq in seqs:
            h = target.model(input_ids=seq).last_hidden_state[0]
            data.append((seq[0], h, target.get_output_embeddings()(h).argmax(-1)))
    params = [p for p in head.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=3e-3)
    for _ in range(steps):
        loss = sum(torch.nn.functional.cross_entropy(
            head.lm_head(head(s[1:], h[:-1], torch.arange(len(s) - 1),
                              causal_mask(len(s) - 1, "cpu"))), y[1:]) for s, h, y in data)
        opt.zero_grad()
        loss.backward()
        opt.step()
    for p in params:
        p.requires_grad_(False)


@torch.no_grad()
def greedy_chain_loop(target, head, prompt: list, depth: int, max_new: int) -> list:
    """Plain chain speculation, written without the measurement's batching: after each
    verify the MTP runs causally over the committed entries (s_{i+1}, h_i), then drafts
    `depth` tokens one by one, each step's output feeding the next; the target verifies
    them in one forward and commits the matching prefix plus its own next token.
    Returns (anchor t, accepted drafts, the draft logits of each depth) per step."""
    out = target.model(input_ids=torch.tensor([prompt])).last_hidden_state[0]
    h = out
    seq = prompt + [int(target.get_output_embeddings()(out[-1]).argmax())]
    steps, last_anchor = [], len(prompt) - 1 + max_new - depth
    while len(seq) - 2 <= last_anchor:
        t = len(seq) - 2
        toks, hid, drafts, logits = list(seq[1:t + 2]), h[:t + 1], [], []
        for _ in range(depth):
            m = head(torch.tensor(toks), hid, torch.arange(len(toks)))[-1:]
            logits.append(head.lm_head(m)[0])
            drafts.append(int(logits[-1].argmax()))
            toks.append(drafts[-1])
            hid = torch.cat([hid, m])
        h2 = target.model(input_ids=torch.tensor([seq + drafts])).last_hidden_state[0]
        y = target.get_output_embeddings()(h2).argmax(-1).tolist()
        a = 0
        while a < depth and drafts[a] == y[t + 1 + a]:
            a += 1
        steps.append((t, a, logits))
        seq = seq + drafts[:a] + [y[t + 1 + a]]
        h = h2[:t + 2 + a]
    return steps


def test_matrix_predicts_a_greedy_chain_loop(tmp_path):
    directory = make_checkpoint(tmp_path / "t", "qwen3_5", seed=1, init=0.1)
    ck, tok, target, head = load(directory)
    depth, max_new = 4, 40
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    seqs = [greedy_continuation(target, torch.tensor([p]), max_new) for p in prompts]
    _train_head(target, head, seqs)

    chain, tree = RankTally(depth, 1), RankTally(depth, 4)
    per_anchor, loop, seen = {}, [], {}
    for i, (p, seq) in enumerate(zip(prompts, seqs)):
        def keep(j, draft, _target, i=i):
            seen[(i, j)] = draft.clone()
            return draft

        got = teacher_forced_ranks(target, head, seq, len(p), depth, 4, predict=keep)
        tree.add(got.ranks)
        chain.add([[r if r == 0 else MISS for r in row] for row in got.ranks])
        for k, row in enumerate(got.ranks):
            run = next((j for j, r in enumerate(row) if r != 0), depth)
            per_anchor[(i, len(p) - 1 + k)] = run
        loop += [(i, t, a, lg) for t, a, lg in greedy_chain_loop(target, head, p, depth, max_new)]

    # where the loop's drafts so far matched, its MTP saw exactly what teacher forcing fed
    # it: the same logits at that depth (the batched masks and key store are right)
    compared = 0
    for i, t, a, logits in loop:
        k = t - (len(prompts[i]) - 1)
        if per_anchor.get((i, t)) != a:
            continue
        for j in range(min(a + 1, depth)):
            assert torch.allclose(logits[j], seen[(i, j + 1)][k], atol=1e-4), (i, t, j)
            compared += j > 0
    assert compared >= 20
    # the chain column of a top-1 matrix is exactly the measured chain over all anchors
    q1 = from_data({"per_depth_rank": chain.matrix()}, "chain")
    assert q1.chain() == pytest.approx(chain.chain_committed(), abs=1e-12)
    assert tree.chain_committed() == pytest.approx(chain.chain_committed(), abs=1e-12)
    accepted = [a for _, _, a, _ in loop]
    assert 0 < sum(accepted) < depth * len(accepted)  # neither always nor never right
    # the loop at an anchor accepts what teacher forcing measured there ...
    same = sum(per_anchor.get((i, t)) == a for i, t, a, _ in loop)
    assert same >= 0.95 * len(loop), (same, len(loop))
    # ... so its mean accepted length is the matrix's, within sampling error
    mean = 1 + sum(accepted) / len(accepted)
    runs = list(per_anchor.values())
    sd = math.sqrt(sum((r - sum(runs) / len(runs)) ** 2 for r in runs) / len(runs))
    assert abs(mean - q1.chain()) <= 3 * sd / math.sqrt(len(loop)) + 0.05, (mean, q1.chain())


def test_tally_counts_trees_and_chains_apart():
    t = RankTally(3, 2)
    t.add([[0, 1, 0], [1, 0, MISS], [MISS, 0, 0], [0, 0, 0]])
    assert t.trials == [4, 3, 3] and t.counts == [[2, 1], [2, 1], [2, 0]]
    assert t.chain_trials == [4, 2, 1] and t.chain_hits == [2, 1, 1]
    assert t.chain_committed() == 1 + (1 + 0 + 0 + 3) / 4
    assert wilson(0, 0) == (0.0, 1.0)
    lo, hi = wilson(5, 10)
    assert lo < 0.5 < hi and hi - 0.5 == pytest.approx(0.5 - lo)


def test_interrupt_keeps_what_was_measured(tmp_path, next_ckpt):
    prompts = write_prompts(tmp_path / "p.jsonl", PROMPTS[:3])
    calls = []

    def stop_in_prompt_two(depth, draft, target_logits):
        calls.append(depth)
        if len(calls) > 2:  # depth 2 of prompt 1 is call 2
            raise KeyboardInterrupt
        return draft

    complete = run_acceptance(AcceptanceOptions(str(next_ckpt), str(prompts), depth=2, max_new=10,
                                                device="cpu", out=tmp_path / "a.json", plot=True))
    assert complete.path == tmp_path / "a.json" and complete.plot_path == tmp_path / "a.png"
    earlier = complete.path.read_bytes()
    res = run_acceptance(AcceptanceOptions(str(next_ckpt), str(prompts), depth=2, max_new=10,
                                           device="cpu", out=tmp_path / "a.json", plot=False),
                         predict=stop_in_prompt_two)
    assert res.interrupted and res.path == tmp_path / "a-partial.json"
    m = load_acceptance(str(res.path))
    assert m.measured["partial"] is True and m.measured["anchors"] == 9
    assert res.document["measurement"]["prompts"]["used"] == 1
    assert (tmp_path / "a.json").read_bytes() == earlier and (tmp_path / "a.png").exists()  # kept whole



def test_a_fifo_named_like_a_weights_file_is_refused_at_once(tmp_path):
    import os

    from bole_cli.mtp.checkpoint import safetensors_keys

    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        safetensors_keys(fifo)  # open() on a FIFO with no writer would block forever
