"""`gaudi-cluster aws`: DL1 clusters on EC2 in one command (plan, up, status, down). See docs/aws.md.

Pure (no boto3, no sockets): facts (tag, defaults, DL1 figures, prices, quota), request (inputs and
their validation), spec (what to create), diff (what is missing), render (what is printed), userdata
(what a node boots with, and how its console is read). Edges: ec2 (session and Cloud = reads + creates
+ deletes over calls), keys (the key files, over ssh or SSM) and delivery (host keys pinned from the
consoles, then the keys sent; SSM parameters deleted once the nodes have them). cli and up sequence
them. boto3 is an optional extra
(`pip install 'gaudi-cluster[aws]'`) imported only when a command connects, so importing any of these
modules needs no boto3, and the node image never carries it.
"""
