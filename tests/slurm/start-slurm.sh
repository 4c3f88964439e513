#!/usr/bin/env bash
# Inside a test container: install the munge key mounted by the test, start munged, then run the
# Slurm daemon of this container's part in the foreground (slurmctld on the controller, slurmd on a
# node). The key is made per test session and mounted read-only; it never enters the image.
set -Eeuo pipefail
part="${1:?usage: start-slurm.sh controller|node}"
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
install -o munge -g munge -m 0400 /run/slurm-test/munge.key /etc/munge/munge.key
runuser -u munge -- /usr/sbin/munged
case "$part" in
controller)
	mkdir -p /var/spool/slurmctld
	exec /usr/sbin/slurmctld -D -i
	;;
node)
	mkdir -p /var/spool/slurmd
	exec /usr/sbin/slurmd -D -N "$(hostname)"
	;;
*)
	echo "start-slurm: unknown part '$part'; fix: controller or node" >&2
	exit 2
	;;
esac
