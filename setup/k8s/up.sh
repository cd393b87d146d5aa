#!/usr/bin/env bash
# A single-node Kubernetes cluster for the tests (tests/deploy/test_kubernetes.py), all its
# state under D (a temporary folder), its binaries from the cache setup/k8s/build.sh fills.
# After ../shared/k8s/RECIPE.md: containerd (restrict_oom_score_adj: this sandbox lacks
# CAP_SYS_RESOURCE) with a CNI bridge (pods on 10.88.0.0/24, the host at 10.88.0.1; no
# kube-proxy, no DNS), etcd, the control plane and a kubelet; node Ready in about 15 s.
# Tear down with down.sh, always.   Usage: D=/tmp/k8s bash setup/k8s/up.sh   (as root)
set -euo pipefail
CACHE=${K8S_CACHE:-$(cd "$(dirname "$0")/../.." && pwd)/.tools/k8s}
D=${D:?the folder of the cluster state}
B=$CACHE/bin; P=$D/pki; L=$D/logs; R=$D/run
NODE=vm; NODE_IP=${NODE_IP:-$(hostname -I | awk '{print $1}')}
mkdir -p $D $L $R; cd $D
t0=$(date +%s); lap() { echo "[$(( $(date +%s)-t0 ))s] $*"; }
[ -x $B/kubelet ] || { echo "no Kubernetes binaries in $B: run setup/k8s/build.sh (make tools)" >&2; exit 1; }

# One cluster at a time: its ports are fixed. A new apiserver would otherwise run on the etcd
# an earlier cluster left listening (a run killed before its down.sh), on that one's state.
for port in 2379 2380 6443 10250 10257 10259; do
  held=$(ss -ltnpH "sport = :$port" 2>/dev/null || true)
  if [ -n "$held" ]; then
    echo "port $port is taken, so another cluster may be running here: $held" >&2
    echo "if it is a cluster a killed run left behind, stop it: D=<its folder, in the process's command line: ps -o args -p PID> bash setup/k8s/down.sh" >&2
    exit 1
  fi
done

# 3. PKI + kubeconfigs
if [ ! -f $P/ca.crt ]; then
  mkdir -p $P && cd $P
  openssl genrsa -out ca.key 2048 2>/dev/null
  openssl req -x509 -new -nodes -key ca.key -subj "/CN=k8s-try-ca" -days 3650 -out ca.crt
  openssl genrsa -out sa.key 2048 2>/dev/null; openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  mk() { openssl genrsa -out $1.key 2048 2>/dev/null
    openssl req -new -key $1.key -subj "/CN=$2${3:+/O=$3}" -out $1.csr
    printf "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n${4:+subjectAltName=$4\n}" > $1.ext
    openssl x509 -req -in $1.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile $1.ext -out $1.crt 2>/dev/null; }
  mk apiserver kube-apiserver "" "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:$NODE_IP,IP:10.96.0.1"
  mk admin admin system:masters
  mk apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
  mk controller-manager system:kube-controller-manager
  mk scheduler system:kube-scheduler
  mk kubelet system:node:$NODE system:nodes
  mk kubelet-serving $NODE "" "DNS:$NODE,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP"
  for n in admin controller-manager scheduler kubelet; do
    K="$B/kubectl --kubeconfig=$D/$n.kubeconfig"
    $K config set-cluster k --server=https://127.0.0.1:6443 --certificate-authority=ca.crt --embed-certs >/dev/null
    $K config set-credentials u --client-certificate=$n.crt --client-key=$n.key --embed-certs >/dev/null
    $K config set-context k --cluster=k --user=u >/dev/null; $K config use-context k >/dev/null
  done
  cd $D
fi
lap pki

# 4. containerd (own root/state/socket) + CNI bridge; restrict_oom_score_adj is REQUIRED here (no CAP_SYS_RESOURCE in this VM)
mkdir -p $D/containerd $D/cni/net.d $D/cni/ipam $D/pod-logs
cat > $D/containerd/config.toml <<EOT
version = 2
root = "$D/containerd/root"
state = "$D/containerd/state"
[grpc]
  address = "$R/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  restrict_oom_score_adj = true
  sandbox_image = "docker.io/local/pause:3.10"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$D/cni/net.d"
EOT
cat > $D/cni/net.d/10-bridge.conflist <<EOT
{"cniVersion": "0.4.0", "name": "k8stry", "plugins": [
  {"type": "bridge", "bridge": "k8stry0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$D/cni/ipam", "ranges": [[{"subnet": "10.88.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "loopback"}]}
EOT
cat /proc/sys/net/ipv4/ip_forward > $R/ip_forward.orig
nohup containerd --config $D/containerd/config.toml > $L/containerd.log 2>&1 & echo $! > $R/containerd.pid
for i in $(seq 30); do [ -S $R/containerd.sock ] && break; sleep 1; done
ctr -a $R/containerd.sock -n k8s.io images import $CACHE/images/pause.tar >/dev/null
lap containerd

# 5. etcd (Debian 3.4.23; plain http on loopback)
nohup etcd --name k8stry --data-dir $D/etcd-data --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster k8stry=http://127.0.0.1:2380 > $L/etcd.log 2>&1 & echo $! > $R/etcd.pid

# 6. control plane
nohup $B/kube-apiserver --etcd-servers=http://127.0.0.1:2379 --advertise-address=$NODE_IP --secure-port=6443 \
  --client-ca-file=$P/ca.crt --tls-cert-file=$P/apiserver.crt --tls-private-key-file=$P/apiserver.key \
  --kubelet-client-certificate=$P/apiserver-kubelet-client.crt --kubelet-client-key=$P/apiserver-kubelet-client.key \
  --service-account-key-file=$P/sa.pub --service-account-signing-key-file=$P/sa.key \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range=10.96.0.0/24 --authorization-mode=Node,RBAC --allow-privileged=true \
  --enable-admission-plugins=NodeRestriction > $L/apiserver.log 2>&1 & echo $! > $R/apiserver.pid
for i in $(seq 90); do curl -sf --cacert $P/ca.crt --cert $P/admin.crt --key $P/admin.key https://127.0.0.1:6443/readyz >/dev/null && break; sleep 1; done
lap apiserver ready
nohup $B/kube-controller-manager --kubeconfig=$D/controller-manager.kubeconfig \
  --authentication-kubeconfig=$D/controller-manager.kubeconfig --authorization-kubeconfig=$D/controller-manager.kubeconfig \
  --service-account-private-key-file=$P/sa.key --root-ca-file=$P/ca.crt \
  --cluster-signing-cert-file=$P/ca.crt --cluster-signing-key-file=$P/ca.key \
  --use-service-account-credentials=true --leader-elect=false > $L/controller-manager.log 2>&1 & echo $! > $R/controller-manager.pid
nohup $B/kube-scheduler --kubeconfig=$D/scheduler.kubeconfig \
  --authentication-kubeconfig=$D/scheduler.kubeconfig --authorization-kubeconfig=$D/scheduler.kubeconfig \
  --leader-elect=false > $L/scheduler.log 2>&1 & echo $! > $R/scheduler.pid

# 7. kubelet (cgroup v1 + cgroupfs; failCgroupV1=false)
cat > $D/kubelet-config.yaml <<EOT
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: $P/ca.crt}}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$R/containerd.sock
failSwapOn: false
failCgroupV1: false
tlsCertFile: $P/kubelet-serving.crt
tlsPrivateKeyFile: $P/kubelet-serving.key
podLogsDir: $D/pod-logs
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
EOT
mkdir -p $D/kubelet-root
nohup $B/kubelet --config=$D/kubelet-config.yaml --kubeconfig=$D/kubelet.kubeconfig \
  --root-dir=$D/kubelet-root --node-ip=$NODE_IP --hostname-override=$NODE > $L/kubelet.log 2>&1 & echo $! > $R/kubelet.pid
export KUBECONFIG=$D/admin.kubeconfig
for i in $(seq 90); do $B/kubectl get node $NODE >/dev/null 2>&1 && break; sleep 1; done
$B/kubectl wait --for=condition=Ready node/$NODE --timeout=90s
# default SA must exist before pods can be created
for i in $(seq 60); do $B/kubectl get sa default >/dev/null 2>&1 && break; sleep 1; done
lap cluster up
