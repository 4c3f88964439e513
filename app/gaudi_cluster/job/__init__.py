"""Master: one job from its settings to its last attempt (settings slices, an attempt, the next one, the
report, the fabric check); master.py is the short loop over them."""
