"""From the survey to running ranks: the program, the launch plan, launchers, the direct fan-out."""
