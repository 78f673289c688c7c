#!/usr/bin/env bash
# make kind-demo: the example policies on the kind cluster, a tenant pod of each slicing mode,
# what each container received from gpuslice's CDI spec, and the apiserver refusing a claim from
# a namespace that is not a tenant. Exits non-zero as soon as any of that does not happen.
set -euo pipefail
cd "$(dirname "$0")/../.."
KUBECTL=${KUBECTL:-kubectl}
TIMEOUT=${KIND_DEMO_TIMEOUT:-300s}
k() { "$KUBECTL" "$@"; }
step() { printf '\n== %s\n' "$*"; }
PODS=(team-a/inference data-science/notebook ml-research/training)

step "Tenant namespaces and the example policies (examples/policies/)"
k apply -f examples/tenants/namespaces.yaml
k apply -f examples/policies/
k wait gsp --all --for=condition=Ready --timeout="$TIMEOUT"
k get gsp

step "What the node agents published (driver gpu.gpuslice.dev, one pool per node)"
k get resourceslices --field-selector spec.driver=gpu.gpuslice.dev

step "A tenant pod of each mode (examples/tenants/pods.yaml)"
k apply -f examples/tenants/pods.yaml
# training-mig.yaml taints its devices NoSchedule (a maintenance window): its pod waits.
k -n ml-research wait pod/training --for=condition=PodScheduled=False --timeout="$TIMEOUT"
echo "training waits: $(k -n ml-research get pod training \
  -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}')"
step "End of the maintenance window: the training policy drops its taint"
k patch gsp training --type=merge -p '{"spec":{"taints":null}}'
for pod in "${PODS[@]}"; do
  if ! k -n "${pod%/*}" wait "pod/${pod#*/}" --for=condition=Ready --timeout="$TIMEOUT"; then
    echo "FAIL: ${pod} is not running; its events:" >&2
    k -n "${pod%/*}" get events --field-selector "involvedObject.name=${pod#*/}" >&2
    exit 1
  fi
done
k get pods -A -l app.kubernetes.io/name=gpuslice-tenant -o wide

step "What each container received (kubectl logs: GPUSLICE_* from gpuslice's CDI spec)"
for pod in "${PODS[@]}"; do
  echo "-- ${pod}: $(k -n "${pod%/*}" get resourceclaims -o \
    jsonpath='{range .items[*]}{.status.allocation.devices.results[*].device} on {.status.allocation.devices.results[*].pool}{end}')"
  k -n "${pod%/*}" logs "${pod#*/}" | grep '^GPUSLICE_'
done

step "A namespace that is not a tenant cannot claim the class"
k create namespace intruder --dry-run=client -o yaml | k apply -f -
if denial=$(k apply -f - 2>&1 <<'CLAIM'
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: borrowed-gpu, namespace: intruder}
spec:
  devices:
    requests:
      - name: gpu
        exactly: {deviceClassName: inference.gpuslice.dev}
CLAIM
); then
  k -n intruder delete resourceclaim borrowed-gpu --wait=false
  echo "FAIL: the apiserver accepted a claim from namespace intruder" >&2
  exit 1
fi
echo "$denial"
k delete namespace intruder --wait=false
printf '\nDone. Uninstall: make kind-undeploy (or make kind-down to delete the cluster).\n'
