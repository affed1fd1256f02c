# Shared helpers for the rule files. Rules stay thin: each calls `python -m phaze <stage>`.
