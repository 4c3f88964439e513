"""optimum-habana's gaudi_spawn.py and DistributedRunner, translated to a master run."""
