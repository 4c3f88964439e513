"""TEST-ONLY stand-in for Habana's DeepSpeed fork (tests/image/standin): metadata and the git hash."""
