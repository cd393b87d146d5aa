#!/bin/bash
# Tear down everything up.sh started; kills only PIDs recorded in $R/*.pid, cleans the host
# paths the runtime touched. Safe to run twice, or after a start that failed half-way.
D=${D:?the folder of the cluster state}; R=$D/run
B=${K8S_CACHE:-$(cd "$(dirname "$0")/../.." && pwd)/.tools/k8s}/bin
export KUBECONFIG=$D/admin.kubeconfig
# let kubelet stop pods (CNI DEL) while everything still runs
if [ -f $R/kubelet.pid ] && kill -0 $(cat $R/kubelet.pid) 2>/dev/null; then
  $B/kubectl delete deploy,rs,sts,ds,job,cronjob --all -A --cascade=orphan >/dev/null 2>&1; $B/kubectl delete pod --all -A --grace-period=1 --wait=false >/dev/null 2>&1
  for i in $(seq 45); do [ -z "$($B/kubectl get pods -A -o name 2>/dev/null)" ] && break; sleep 1; done
fi
stop() { [ -f $R/$1.pid ] || return 0; p=$(cat $R/$1.pid); kill $p 2>/dev/null; for i in $(seq 20); do kill -0 $p 2>/dev/null || break; sleep 0.5; done; kill -9 $p 2>/dev/null; rm -f $R/$1.pid; }
stop kubelet; stop kube-scheduler; stop scheduler; stop controller-manager; stop apiserver
# remaining containers/sandboxes (tasks' shims are children of containerd's tree, addressed via ctr)
if [ -S $R/containerd.sock ]; then
  C="ctr -a $R/containerd.sock -n k8s.io"
  for t in $($C tasks ls -q 2>/dev/null); do $C tasks kill -s SIGKILL $t >/dev/null 2>&1; done; sleep 1
  for t in $($C tasks ls -q 2>/dev/null); do $C tasks rm -f $t >/dev/null 2>&1; done
  for c in $($C containers ls -q 2>/dev/null); do $C containers rm $c >/dev/null 2>&1; done
fi
stop containerd; stop etcd
# leftovers: mounts, netns created by the CRI, the bridge, pod cgroups, ip_forward
for m in $(mount | awk '{print $3}' | grep "^$D/" | sort -r); do umount -l $m 2>/dev/null; done
for n in $(ls /var/run/netns 2>/dev/null | grep '^cni-'); do ip netns del $n 2>/dev/null; done
ip link del k8stry0 2>/dev/null
for s in /sys/fs/cgroup/*/kubepods; do [ -d $s ] && find $s -depth -type d -exec rmdir {} + 2>/dev/null; done
[ -f $R/ip_forward.orig ] && cat $R/ip_forward.orig > /proc/sys/net/ipv4/ip_forward
# files the CNI library / kubelet write at fixed host paths
for f in /var/log/containers/*.log; do [ -L "$f" ] && readlink "$f" | grep -q "^$D/" && rm -f "$f"; done
rm -f /var/lib/cni/results/k8stry-* /var/lib/cni/results/cni-loopback-*
# drop the (now empty) host dirs the runtime created
for d in /run/containerd /var/lib/cni /var/log/containers /run/netns; do [ -d $d ] && ! mountpoint -q $d && find $d -depth -type d -empty -delete; done
echo down
