"""Cross-cutting pieces every layer may use: settings, errors, Redis keys, logging."""
