#!/usr/bin/env bash
# Uninstall gpuslice and leave nothing behind:   hack/uninstall.sh [OVERLAY]   (make undeploy)
# The order matters:
#  1. The policies, while the controller still runs: its finalizer holds each one until no claim
#     holds its devices (delete those workloads first), it removes the admin-access and tenancy
#     labels it set, and owner references take the DeviceClasses, claim templates, quotas and
#     taint rules with the policy. Once the controller is gone, no finalizer is left to block the CRD.
#  2. The maxMemory webhook's configuration, then the webhook, the controller and the agents,
#     waiting until their pods are gone (foreground), so no agent publishes again after step 5 and
#     no claim waits on a webhook that is gone.
#  3. The admission policies (manifests/admission.yaml and the agents' own rules), and any tenancy
#     or memory-limit label left on a namespace (set by hand: the controller takes off those it set). Any order
#     would leave other drivers' claims working (docs/policies.md, "Its CRD missing"); this one leaves nothing.
#  4. The agents' drain lists (ConfigMaps gpuslice-draining-<node>, one per node that was draining,
#     made by the agents, not by the overlay), then everything else the overlay installed: RBAC,
#     the CRD, the namespace.
#  5. Kept on purpose: gpuslice-configmap-params (manifests/configmap-params.yaml), an admission
#     policy and binding that judge nothing and keep the API servers watching ConfigMap parameters,
#     so that installing again needs no API server restart (kubernetes/kubernetes#130887).
#  6. What outlives the objects above by design: the agents' ResourceSlices (owned by their Node;
#     the agents delete them when no policy is left, and the kubelet drops a driver's slices 30 s
#     after its plugin goes).
set -euo pipefail
cd "$(dirname "$0")/.."
KUBECTL=${KUBECTL:-kubectl}
OVERLAY=${1:-manifests/overlays/kind}
TIMEOUT=${UNINSTALL_TIMEOUT:-300}
k() { "$KUBECTL" "$@"; }

if k get crd gpuslicepolicies.gpuslice.dev >/dev/null 2>&1; then
  echo "uninstall: deleting GpuSlicePolicies (the controller releases what each one made)"
  k delete gsp --all --wait=false
  deadline=$((SECONDS + TIMEOUT))
  while [ -n "$(k get gsp -o name)" ]; do
    if [ $SECONDS -ge $deadline ]; then
      echo "uninstall: policies still waiting for claims to release their devices:" >&2
      k get gsp -o custom-columns='POLICY:.metadata.name,HOLDING CLAIMS:.status.holdingClaims' >&2
      echo "uninstall: delete the workloads that hold these claims, then run this again." >&2
      exit 1
    fi
    sleep 2
  done
fi
echo "uninstall: deleting the maxMemory webhook's configuration; stopping the webhook, the controller and the node agents"
k delete validatingwebhookconfiguration gpuslice-memory --ignore-not-found
k -n gpuslice-system delete daemonset/gpuslice-agent deployment/gpuslice-controller deployment/gpuslice-webhook \
  --cascade=foreground --ignore-not-found --wait --timeout="${TIMEOUT}s"
echo "uninstall: deleting the admission policies (not gpuslice-configmap-params: kept) and any tenancy label left"
for selector in app.kubernetes.io/part-of=gpuslice app.kubernetes.io/managed-by=gpuslice; do
  k delete validatingadmissionpolicybindings,validatingadmissionpolicies -l "$selector,gpuslice.dev/kept!=true" \
    --ignore-not-found
done
k label namespaces -l gpuslice.dev/tenancy gpuslice.dev/tenancy- >/dev/null
k label namespaces -l gpuslice.dev/memory-limit gpuslice.dev/memory-limit- >/dev/null
echo "uninstall: deleting the node agents' drain lists"
k -n gpuslice-system delete configmaps -l gpuslice.dev/drain-list --ignore-not-found
k -n gpuslice-system delete configmap gpuslice-draining --ignore-not-found  # the one list of earlier versions
echo "uninstall: deleting what $OVERLAY installed (but what is labelled gpuslice.dev/kept)"
k delete -k "$OVERLAY" -l 'gpuslice.dev/kept!=true' --ignore-not-found --wait --timeout="${TIMEOUT}s"
echo "uninstall: deleting any ResourceSlice the agents left"
k delete resourceslices --field-selector spec.driver=gpu.gpuslice.dev --ignore-not-found
echo "uninstall: done"
