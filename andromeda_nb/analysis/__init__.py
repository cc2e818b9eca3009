"""What the notebooks compute and plot: committed results tables, figures, retrieval metrics, the
quality experiments and the scoring report."""
