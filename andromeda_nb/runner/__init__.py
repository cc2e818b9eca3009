"""The notebook series runner (papermill) behind ``python -m andromeda_nb run``, and the helpers a
notebook calls (parameter checks, recorded metrics)."""
