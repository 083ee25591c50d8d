# Shared helpers for the rules: paths and config lookups.


def cfg(*keys):
    """config lookup by path, e.g. cfg("quant_error", "rows")."""
    node = config
    for key in keys:
        node = node[key]
    return node
