"""TEST-ONLY stand-in for Habana's habana_frameworks (never installed in an image).

tests/ohabana put it on PYTHONPATH so that optimum-habana's GaudiTrainer runs on CPU: it provides only
what the CPU path touches (HPU memory statistics for the log, the HPU seed for set_seed).
"""
