"""What `bole inspect-tree` shows of a draft tree (docs/design.md §4): the report (`report`:
nodes, scores, the batch budget, transient memory), the Rich view of a tree and its ancestor
mask (`view`) and the plot (`plot`, matplotlib imported when a plot is drawn)."""
