"""What the notebooks compute and plot, so that the notebooks hold parameters, calls and figures only.

Shared: :mod:`.results` (the committed GPU tables), :mod:`.plots` (one figure style, deterministic
saves), :mod:`.metrics` (recall and overlap), :mod:`.quality` (the trained-model experiments behind
``data/results/quality.csv``). One module per notebook: :mod:`.evaluation` (01 quickstart),
:mod:`.scoring_report` and :mod:`.scoring_figures` (02), :mod:`.topk_report` (03),
:mod:`.targeting_report` (04), :mod:`.expert_count_report` (05), :mod:`.precision_report` (06).
"""
