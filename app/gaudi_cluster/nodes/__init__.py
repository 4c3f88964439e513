"""Who the nodes are and what each reports: discovery, ssh, the probe, devices, preflight checks."""
