"""One rank's life on its node: the agent, the job directory, process groups, reaping."""
