"""`gaudi-cluster aws`: DL1 clusters on EC2 in one command (plan, up, status, down). See docs/aws.md.

Pure (no boto3, no sockets): facts (tag, defaults, DL1 figures, prices, quota), request (inputs and
their validation), spec (what to create), diff (what is missing), render (what is printed), userdata
(what a node boots with). Edges: ec2 (session and Cloud = reads + creates + deletes over calls) and
keys (the cluster key over ssh or SSM). cli and up sequence them. boto3 is an optional extra
(`pip install 'gaudi-cluster[aws]'`) imported only when a command connects, so importing any of these
modules needs no boto3, and the node image never carries it.
"""
