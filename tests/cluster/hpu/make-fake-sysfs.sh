#!/usr/bin/env bash
# make-fake-sysfs.sh ROOT: TEST-ONLY. A sysfs tree shaped like a Gaudi server's, for the detection code
# (GAUDI_CLUSTER_SYSFS_ROOT=ROOT): eight accel devices bound to habanalabs (Gaudi cards), one accel
# device bound to intel_vpu (an Intel NPU, which also lives in /dev/accel) and a Gaudi NIC netdev hl0.
# Links are relative, as in /sys: class/accel/accelN/device -> ../../../devices/pci.../BDF, whose
# driver -> ../../../bus/pci/drivers/NAME.
set -Eeuo pipefail

root="${1:?usage: make-fake-sysfs.sh ROOT}"

# device CLASS NAME BDF DRIVER
device() {
	local class="$1" name="$2" bdf="$3" driver="$4"
	mkdir -p "$root/bus/pci/drivers/$driver" "$root/devices/pci0000:00/$bdf" "$root/class/$class/$name"
	ln -sfn "../../../bus/pci/drivers/$driver" "$root/devices/pci0000:00/$bdf/driver"
	ln -sfn "../../../devices/pci0000:00/$bdf" "$root/class/$class/$name/device"
}

for i in 0 1 2 3 4 5 6 7; do
	device accel "accel$i" "0000:$((33 + i)):00.0" habanalabs
done
device accel accel8 0000:c1:00.0 intel_vpu
device net hl0 0000:33:00.1 habanalabs
