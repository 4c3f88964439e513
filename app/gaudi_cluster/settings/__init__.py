"""Settings: the one declaration per setting, value parsers, the Gaudi software profiles."""
