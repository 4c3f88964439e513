"""What the operator sees: the live line, stragglers, status, the job report, failure diagnosis."""
