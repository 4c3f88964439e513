"""What crosses between processes: the control protocol and its channel, the node report, the node spec."""
