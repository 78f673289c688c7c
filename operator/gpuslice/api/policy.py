"""The GpuSlicePolicy API (``gpuslice.dev/v1alpha1``), as pydantic models.

These models are the single source of truth: the CRD in ``crds/`` is generated
from them (``make crds``), their docstrings and field descriptions become the
CRD's documentation, and their rules are both CEL at admission and Python
checks here.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from gpuslice.api.rules import DNS_LABEL, DNS_SUBDOMAIN, ApiModel, Rule, cel_regex
from gpuslice.api.topology import Topology
from gpuslice.coordinates import GROUP as GROUP
from gpuslice.coordinates import POLICY_PLURAL
from gpuslice.coordinates import VERSION as VERSION
from gpuslice.dra.names import CONTROLLER_NAMESPACE, SAFETY_TAINT_KEYS
from gpuslice.dra.quantity import parse_quantity, quantity_bytes

KIND = "GpuSlicePolicy"
PLURAL = POLICY_PLURAL
MAX_NAME = 50
MIG_PROFILE = r"^[1-7]g\.[0-9]+gb(\+me)?$"
TENANT_NAMESPACE_MESSAGE = "tenants[].namespace must be a namespace name: lowercase letters, digits and '-'"
# The API server's rule, in the namespace the manifests install into (the chart templates it with the
# release's). No Python mirror: the model does not know where it runs; the controller judges its own
# namespace as a tenant or admin namespace (planning.validation, reason ControllerNamespace).
CONTROLLER_NAMESPACE_MESSAGE = (
    f"{CONTROLLER_NAMESPACE} is gpuslice's own namespace and cannot be a tenant or an admin namespace:"
    " the controller proves tenancy is enforced by being refused a claim there")
# The name part of a qualified name (label keys, taint keys, extended resources): at most 63.
QUALIFIED_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
TAINT_KEY = rf"^({SUBDOMAIN}/)?{QUALIFIED_NAME}$"
LABEL_VALUE = rf"^{QUALIFIED_NAME}$"
NVIDIA_RESOURCE = r"^([^/]*\.)?nvidia\.com/"  # the device plugin's resources (and any of NVIDIA's domain)
# The apiserver checks "requests.<extendedResourceName>" as a qualified name: its domain, with the
# 9 characters of "requests.", may have at most 253.
EXTENDED = rf"^{SUBDOMAIN}/{QUALIFIED_NAME}$"
EXTENDED_DOMAIN_LENGTH = r"^[^/]{1,244}/"
MAX_TEMPLATE_NAME = 230  # room for the per-kind suffix, e.g. -1g.10gb-me (templates have 253)

# Bounded strings: the apiserver estimates CEL cost from maxLength.
Name = Annotated[str, StringConstraints(max_length=63)]
Text = Annotated[str, StringConstraints(max_length=317)]


MIN_SLICE = "256Mi"
# Upper bounds on every number of the spec, so that nothing computed from them (the bytes of a
# limit, a quota) can pass what the API server stores: an int64. A count of devices past a
# million is more than any cluster publishes; a size past 16Ti more than any GPU has.
MAX_COUNT = 1_000_000
MAX_MEMORY = "16Ti"
# The most maxMemory may say: far above any fleet, and its bytes fit an int64 (status.limitBytes).
MAX_TENANT_MEMORY = "1Pi"
MAX_TENANT_MEMORY_MESSAGE = (f"tenants[].maxMemory must be a positive quantity of at most {MAX_TENANT_MEMORY}, such as"
                             " 30Gi: the most GPU memory the namespace may hold through this policy at once")


def _positive_quantity(value: str | None) -> bool:
    if value is None:
        return True
    try:
        return parse_quantity(value) > 0
    except ValueError:
        return False


def _positive_quantity_cel(field: str) -> str:
    return (f"!has(self.{field}) || (isQuantity(self.{field}) &&"
            f" quantity(self.{field}).isGreaterThan(quantity('0')))")


def _at_most(value: str | None, bound: str) -> bool:
    """Whether ``value`` (a quantity, or not one: another rule says so) is at most ``bound``."""
    if value is None:
        return True
    try:
        return parse_quantity(value) <= parse_quantity(bound)
    except ValueError:
        return True


def _at_most_cel(field: str, bound: str) -> str:
    return (f"!has(self.{field}) || !isQuantity(self.{field}) ||"
            f" !quantity(self.{field}).isGreaterThan(quantity('{bound}'))")


Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]


class LabelSelectorRequirement(ApiModel):
    """One requirement of a label selector, as in Kubernetes' LabelSelector."""

    key: str = Field(max_length=317, description="The label key the requirement applies to.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="How the key relates to the values.")
    values: list[Text] = Field(default_factory=list, max_length=64, description=(
        "Values for In and NotIn; empty for Exists and DoesNotExist."))

    rules = (
        Rule("(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
             "In and NotIn need values; Exists and DoesNotExist take none",
             lambda s: bool(s.values) == (s.operator in ("In", "NotIn"))),
    )


class LabelSelector(ApiModel):
    """Selects nodes by their labels; empty selects every node."""

    match_labels: dict[Text, Text] = Field(default_factory=dict, description=(
        "Labels a node must carry with exactly these values."))
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=32, description="Requirements a node's labels must all meet.")

    def matches(self, labels: dict[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for requirement in self.match_expressions:
            present, value = requirement.key in labels, labels.get(requirement.key)
            ok = {
                "In": present and value in requirement.values,
                "NotIn": not present or value not in requirement.values,
                "Exists": present,
                "DoesNotExist": not present,
            }[requirement.operator]
            if not ok:
                return False
        return True


class GpuSelector(ApiModel):
    """Which GPUs on the selected nodes this policy slices; empty selects all of them."""

    products: list[Text] = Field(default_factory=list, max_length=32, description=(
        "GPU product names, as NVML reports them (\"NVIDIA H100 80GB HBM3\") or as GPU Feature Discovery"
        " labels them (\"NVIDIA-H100-80GB-HBM3\"): both spellings are one product; empty means any."))
    min_memory: str | None = Field(default=None, max_length=32, description=(
        "Only GPUs with at least this much memory, e.g. 40Gi."))

    rules = (
        Rule(_positive_quantity_cel("minMemory"),
             "gpuSelector.minMemory must be a positive quantity such as 40Gi",
             lambda s: _positive_quantity(s.min_memory), ".minMemory"),
        Rule(_at_most_cel("minMemory", MAX_MEMORY),
             f"gpuSelector.minMemory must be at most {MAX_MEMORY}: no GPU has more memory",
             lambda s: _at_most(s.min_memory, MAX_MEMORY), ".minMemory"),
    )

    @property
    def min_memory_bytes(self) -> int:
        return quantity_bytes(self.min_memory) if self.min_memory else 0


class MigSlicing(ApiModel):
    """MIG partitions, created on demand (profiles) or laid out ahead (layout)."""

    profiles: list[Name] | None = Field(default=None, max_length=16, description=(
        "Dynamic MIG: every placement of each of these profiles (e.g. 1g.10gb, 3g.40gb) is offered"
        " as a device, and the MIG instance is created when a claim is prepared."))
    layout: dict[Name, int] | None = Field(default=None, max_length=16, description=(
        "Static MIG: each selected GPU is reconfigured, one at a time and only when idle, to hold"
        " this many instances of each profile, e.g. {\"3g.40gb\": 1, \"1g.10gb\": 4}."))

    rules = (
        Rule("!(has(self.profiles) && has(self.layout))",
             "slicing.mig: set either profiles (dynamic MIG) or layout (static MIG), not both",
             lambda s: not (s.profiles is not None and s.layout is not None)),
        Rule("has(self.profiles) || has(self.layout)",
             "slicing.mig needs profiles (dynamic MIG) or layout (static MIG)",
             lambda s: s.profiles is not None or s.layout is not None),
        Rule(f"!has(self.profiles) || (size(self.profiles) > 0 &&"
             f" self.profiles.all(p, p.matches({cel_regex(MIG_PROFILE)})))",
             "slicing.mig.profiles must list MIG profile names such as 1g.10gb or 3g.40gb",
             lambda s: s.profiles is None or (bool(s.profiles) and all(re.match(MIG_PROFILE, p)
                                                                         for p in s.profiles))),
        Rule(f"!has(self.layout) || (size(self.layout) > 0 &&"
             f" self.layout.all(p, p.matches({cel_regex(MIG_PROFILE)}) && self.layout[p] >= 1 && self.layout[p] <= 7))",
             "slicing.mig.layout maps MIG profile names such as 1g.10gb to a count from 1 to 7"
             " (a GPU holds at most 7 MIG instances)",
             lambda s: s.layout is None or (bool(s.layout) and all(
                 re.match(MIG_PROFILE, p) and 1 <= n <= 7 for p, n in s.layout.items()))),
    )


SlicingModeName = Literal["memory", "shared", "mig"]
"""The slicing modes the API accepts; what each one is lives in ``planning.modes`` (a test holds the two equal)."""


class Slicing(ApiModel):
    """How each selected GPU is cut into devices that tenants claim."""

    mode: SlicingModeName = Field(description=(
        "memory: fixed slices of sliceSize that draw on the GPU's memory counter (KEP-4815);"
        " shared: one device per GPU that many claims share, each taking capacity in steps of"
        " sliceSize (KEP-5075); mig: hardware MIG partitions."))
    slice_size: str | None = Field(default=None, max_length=32, description=(
        "memory mode: the size of each slice; shared mode: the default request and the step of"
        " requests. A quantity such as 10Gi. Not used in mig mode."))
    allow_full_gpu: bool = Field(default=False, description=(
        "memory mode: also offer each whole GPU as one device (it is free only while none of its"
        " slices is allocated)."))
    mig: MigSlicing | None = Field(default=None, description="MIG settings; mig mode only.")
    isolation: Literal["None", "MPS"] = Field(default="None", description=(
        "memory and shared mode: None (the default) makes a slice a scheduling boundary only. MPS runs one"
        " NVIDIA MPS control daemon per GPU and tenant namespace that has such devices allocated and gives"
        " each container a pinned device memory limit equal to its allocation and an active-thread percentage"
        " in proportion: CUDA allocations beyond the slice fail. A namespace's daemon, its control pipe and"
        " shared memory are its own (the containers of one namespace share them, no other tenant's do);"
        " namespaces on one GPU have a server each, which the GPU time-slices. MPS is cooperative (a process"
        " that changes its own environment escapes it); MIG is the hard boundary between tenants. Volta or"
        " newer GPUs only."))

    rules = (
        Rule("self.mode == 'mig' || has(self.sliceSize)",
             "slicing.sliceSize is required in memory and shared mode, e.g. sliceSize: 10Gi",
             lambda s: s.mode == "mig" or s.slice_size is not None),
        Rule("self.mode != 'mig' || !has(self.sliceSize)",
             "slicing.sliceSize does not apply in mig mode (the MIG profiles set the sizes); remove it",
             lambda s: s.mode != "mig" or s.slice_size is None),
        Rule("self.mode != 'mig' || has(self.mig)",
             "slicing.mig is required in mig mode: set mig.profiles or mig.layout",
             lambda s: s.mode != "mig" or s.mig is not None),
        Rule("self.mode == 'mig' || !has(self.mig)",
             "slicing.mig is only allowed with mode: mig",
             lambda s: s.mode == "mig" or s.mig is None),
        Rule("!self.allowFullGpu || self.mode == 'memory'",
             "slicing.allowFullGpu applies to memory mode only (in mig mode list the full profile,"
             " e.g. 7g.80gb; in shared mode a claim can request the whole memory)",
             lambda s: not s.allow_full_gpu or s.mode == "memory"),
        Rule("self.mode != 'mig' || !has(self.isolation) || self.isolation == 'None'",
             "slicing.isolation: MPS applies to memory and shared mode; MIG instances are isolated by the GPU"
             " itself, remove isolation",
             lambda s: s.mode != "mig" or s.isolation == "None", ".isolation"),
        Rule(_positive_quantity_cel("sliceSize"),
             "slicing.sliceSize must be a positive quantity such as 10Gi or 512Mi",
             lambda s: _positive_quantity(s.slice_size), ".sliceSize"),
        Rule(f"!has(self.sliceSize) || !isQuantity(self.sliceSize) ||"
             f" !quantity(self.sliceSize).isLessThan(quantity('{MIN_SLICE}'))",
             f"slicing.sliceSize must be at least {MIN_SLICE}: smaller slices would flood the scheduler"
             " with devices; use e.g. 1Gi",
             lambda s: not _positive_quantity(s.slice_size) or s.slice_size is None
             or parse_quantity(s.slice_size) >= parse_quantity(MIN_SLICE), ".sliceSize"),
        Rule(_at_most_cel("sliceSize", MAX_MEMORY),
             f"slicing.sliceSize must be at most {MAX_MEMORY}: no GPU has more memory",
             lambda s: _at_most(s.slice_size, MAX_MEMORY), ".sliceSize"),
    )

    @property
    def slice_bytes(self) -> int:
        return quantity_bytes(self.slice_size) if self.slice_size else 0


class Tenant(ApiModel):
    """A namespace whose workloads may claim this policy's devices, and how many of each kind.

    A tenant with any of the count limits set is limited by count: each kind of device it is not
    granted is a limit of 0, so the memory it can hold is bounded by the sum over kinds of count x
    size. ``maxMemory`` bounds the memory itself, exactly, in every mode. A tenant with none set
    has no limit at all.
    """

    namespace: str = Field(max_length=63, description="The tenant's namespace; it may not exist yet.",
                           json_schema_extra={"x-kubernetes-validations": [
                               {"rule": f"self.matches({cel_regex(DNS_LABEL)})", "message": TENANT_NAMESPACE_MESSAGE},
                               {"rule": f"self != '{CONTROLLER_NAMESPACE}'", "message": CONTROLLER_NAMESPACE_MESSAGE},
                           ]})
    max_slices: int | None = Field(default=None, ge=0, le=MAX_COUNT, description=(
        "memory and shared mode: most slices of sliceSize this namespace may hold at once (in"
        " shared mode, each allocation is then one sliceSize), enforced by a ResourceQuota."
        " 0 to 1,000,000."))
    max_full_gpus: int | None = Field(default=None, ge=0, le=MAX_COUNT, description=(
        "memory mode with allowFullGpu: most whole GPUs this namespace may hold at once. A limited"
        " tenant (any max* set) gets none unless this grants them. 0 to 1,000,000."))
    max_mig_devices: dict[Name, Count] | None = Field(
        default=None, max_length=16, description=(
            "mig mode: most MIG devices of each profile this namespace may hold at once, e.g."
            " {\"1g.10gb\": 4, \"3g.40gb\": 1}; a profile not listed is a limit of 0. Each 0 to 1,000,000."))
    max_memory: str | None = Field(default=None, max_length=32, description=(
        "Every mode: the most GPU memory this namespace may hold through this policy at once, e.g. 30Gi,"
        " counted as each allocation holds it (a slice's size, a whole GPU's memory, a MIG profile's"
        " memory, or in shared mode the capacity the allocation consumed). It is charged when the"
        " scheduler writes an allocation, by gpuslice's admission webhook, exactly under concurrent"
        " allocations. With the count limits it is one more bound; alone it is the only one (in shared"
        " mode such a tenant may then ask for any capacity)."),
        json_schema_extra={"x-kubernetes-validations": [
            {"rule": f"isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))"
                     f" && !quantity(self).isGreaterThan(quantity('{MAX_TENANT_MEMORY}'))",
             "message": MAX_TENANT_MEMORY_MESSAGE}]})

    rules = (
        Rule(None,  # a rule on the string itself (above): on the object, the estimated cost is too high
             TENANT_NAMESPACE_MESSAGE, lambda s: re.match(DNS_LABEL, s.namespace) is not None),
        Rule(None, MAX_TENANT_MEMORY_MESSAGE, lambda s: s.max_memory is None or (
            _positive_quantity(s.max_memory) and parse_quantity(s.max_memory) <= parse_quantity(MAX_TENANT_MEMORY))),
    )

    @property
    def count_limited(self) -> bool:
        """Limited by a count of devices (a ResourceQuota per kind)."""
        return self.max_slices is not None or self.max_full_gpus is not None or self.max_mig_devices is not None

    @property
    def memory_limited(self) -> bool:
        """Limited by maxMemory (charged at allocation by the webhook)."""
        return self.max_memory is not None

    @property
    def limited(self) -> bool:
        return self.count_limited or self.memory_limited

    @property
    def max_memory_bytes(self) -> int | None:
        return quantity_bytes(self.max_memory) if self.max_memory is not None else None


class AdminAccess(ApiModel):
    """Namespaces allowed to claim this policy's devices with adminAccess: true (monitoring,
    debugging): such claims see devices that are in use by others."""

    namespaces: list[Name] = Field(default_factory=list, max_length=16, description=(
        "gpuslice labels these namespaces resource.kubernetes.io/admin-access=true and allows"
        " adminAccess requests for this policy's devices only from them."),
        json_schema_extra={"x-kubernetes-list-type": "set", "x-kubernetes-validations": [
            {"rule": f"!('{CONTROLLER_NAMESPACE}' in self)", "message": CONTROLLER_NAMESPACE_MESSAGE}]})

    rules = (
        Rule(f"!has(self.namespaces) || self.namespaces.all(n, n.matches({cel_regex(DNS_LABEL)}))",
             "adminAccess.namespaces must be namespace names: lowercase letters, digits and '-'",
             lambda s: all(re.match(DNS_LABEL, n) and len(n) <= 63 for n in s.namespaces)),
        Rule(None,  # the schema's list-type "set" rejects duplicates ("Duplicate value")
             "adminAccess.namespaces lists a namespace twice; list each once",
             lambda s: len(set(s.namespaces)) == len(s.namespaces)),
    )


class Taint(ApiModel):
    """A device taint put on every device of this policy (via DeviceTaintRules)."""

    key: str = Field(max_length=253, description="Taint key, e.g. gpuslice.dev/maintenance.")
    value: str = Field(default="", max_length=63, description="Taint value; may be empty.")
    effect: Literal["NoSchedule", "NoExecute", "None"] = Field(description=(
        "NoSchedule: no new allocations; NoExecute: also evicts pods using the devices unless"
        " they tolerate it; None: only informs."))
    tolerable: bool = Field(default=False, description=(
        "Whether tenants' claims may tolerate this taint. By default they may not: a claim for"
        " this policy's devices that tolerates it is refused at admission."))

    rules = (
        Rule(f"self.key.matches({cel_regex(TAINT_KEY)})",
             "taints[].key must be a qualified name such as gpuslice.dev/maintenance: an optional DNS"
             " prefix and '/', then at most 63 letters, digits, '-', '_' or '.', starting and ending"
             " with a letter or digit",
             lambda s: re.match(TAINT_KEY, s.key) is not None, ".key"),
        Rule(f"self.value == '' || self.value.matches({cel_regex(LABEL_VALUE)})",
             "taints[].value must be empty or at most 63 letters, digits, '-', '_' or '.', starting and"
             " ending with a letter or digit",
             lambda s: s.value == "" or re.match(LABEL_VALUE, s.value) is not None, ".value"),
        Rule(f"!(self.key in [{', '.join(repr(k) for k in SAFETY_TAINT_KEYS)}])",
             f"taints[].key may not be one of gpuslice's own safety taints ({', '.join(SAFETY_TAINT_KEYS)}):"
             " the node agent sets those; choose another key, e.g. gpuslice.dev/maintenance",
             lambda s: s.key not in SAFETY_TAINT_KEYS, ".key"),
    )


class Defragmentation(ApiModel):
    """Whether the gpuslice controller moves pods on its own to free a GPU for a pod that waits
    (docs/controller.md#defragmentation). ``gpuslice defrag`` plans and applies the same moves by
    hand whatever the mode."""

    mode: Literal["Off", "Auto"] = Field(default="Off", description=(
        "Off: the controller moves nothing (gpuslice defrag still can, by hand). Auto: for a pod whose"
        " claim of this policy has waited minPendingSeconds while the policy's GPUs hold enough free"
        " memory in pieces, the controller evicts the fewest movable pods that free one GPU for it,"
        " one GPU at a time, within maxEvictionsPerHour."))
    max_evictions_per_hour: int = Field(default=6, ge=0, le=1000, description=(
        "Auto: most pods the controller evicts for this policy in any hour (a plan that needs more than"
        " what is left waits)."))
    min_pending_seconds: int = Field(default=300, ge=0, le=86400, description=(
        "Auto: how long a pod's claim must have waited before pods are moved for it (the scheduler may"
        " yet place it as pods end on their own)."))


class GpuSlicePolicySpec(ApiModel):
    """What a platform team decides for a set of GPUs: how they are sliced and who may use them."""

    node_selector: LabelSelector = Field(default_factory=LabelSelector, description=(
        "Which nodes' GPUs this policy slices; empty selects every GPU node."))
    gpu_selector: GpuSelector = Field(default_factory=GpuSelector, description=(
        "Which GPUs on those nodes; empty selects all."))
    slicing: Slicing
    tenants: list[Tenant] = Field(default_factory=list, max_length=64, description=(
        "Namespaces that may claim these slices. Claims in other namespaces are denied at admission."),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["namespace"]})
    claim_template_name: str = Field(default="gpu-slice", max_length=MAX_TEMPLATE_NAME, description=(
        "Name of the ResourceClaimTemplate created in every tenant namespace for one device of the"
        " policy's smallest kind it may use; <name>-full (a whole GPU) and <name>-<profile> (MIG)"
        " ask for the other kinds. Pods reference it in spec.resourceClaims[].resourceClaimTemplateName."))
    admin_access: AdminAccess = Field(default_factory=AdminAccess, description=(
        "Who may claim these devices with adminAccess."))
    taints: list[Taint] = Field(default_factory=list, max_length=16, description=(
        "Device taints on all of this policy's devices, e.g. for maintenance."),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["key", "effect"]})
    extended_resource_name: str | None = Field(default=None, max_length=253, description=(
        "Serve pods that request this extended resource (e.g. example.com/gpu-slice) with this"
        " policy's devices: the migration path from device plugins."))
    on_overuse: Literal["Report", "Evict"] = Field(default="Report", description=(
        "What the node agent does when a pod uses more GPU memory than its devices of this policy hold"
        " (beyond the agent's --overuse-tolerance, for --overuse-grace seconds): Report (an Event on the pod, a"
        " metric and a condition on its claim) or Evict (the same, then the pod is evicted through the"
        " Eviction API, so PodDisruptionBudgets hold)."))
    defragmentation: Defragmentation = Field(default_factory=Defragmentation, description=(
        "Moving pods to free a GPU (or a large slice) for a pod that waits while the policy's GPUs hold"
        " enough free memory in pieces. Off by default."))
    topology: Topology | None = Field(default=None, description=(
        "Claim templates for several whole GPUs that sit together (one NVLink domain, NUMA node or PCIe root;"
        " docs/topology.md), for training: memory mode with allowFullGpu only. Unset: none."))

    rules = (
        Rule(None,  # the schema's list-map key rejects duplicates ("Duplicate value")
             "tenants lists a namespace twice; list each tenant namespace once",
             lambda s: len({t.namespace for t in s.tenants}) == len(s.tenants), ".tenants"),
        Rule(f"self.claimTemplateName.matches({cel_regex(DNS_SUBDOMAIN)})",
             "claimTemplateName must be a valid object name: lowercase letters, digits, '-' and '.'",
             lambda s: re.match(DNS_SUBDOMAIN, s.claim_template_name) is not None, ".claimTemplateName"),
        Rule(f"!has(self.extendedResourceName) || (self.extendedResourceName.matches({cel_regex(EXTENDED)})"
             f" && self.extendedResourceName.matches({cel_regex(EXTENDED_DOMAIN_LENGTH)}))",
             "extendedResourceName must look like example.com/gpu-slice (a domain of at most 244"
             " characters, '/', a name of at most 63)",
             lambda s: s.extended_resource_name is None
             or (re.match(EXTENDED, s.extended_resource_name) is not None
                 and re.match(EXTENDED_DOMAIN_LENGTH, s.extended_resource_name) is not None), ".extendedResourceName"),
        Rule("!has(self.extendedResourceName) || (!self.extendedResourceName.contains('kubernetes.io/')"
             " && !self.extendedResourceName.startsWith('requests.'))",
             "extendedResourceName may not be in the kubernetes.io domain or start with 'requests.': the"
             " apiserver keeps those for native resources; use your own domain, e.g. example.com/gpu-slice",
             lambda s: s.extended_resource_name is None
             or ("kubernetes.io/" not in s.extended_resource_name
                 and not s.extended_resource_name.startswith("requests.")), ".extendedResourceName"),
        # A pod asking nvidia.com/gpu: 1 expects a whole GPU on every node: the device plugin (and
        # NVIDIA's DRA driver's gpu.nvidia.com class, its chart's deviceclass-gpu.yaml) serve that
        # name. A slice under it would be a whole GPU on one node and 10G on the next.
        Rule(f"!has(self.extendedResourceName) || !self.extendedResourceName.matches({cel_regex(NVIDIA_RESOURCE)})",
             "extendedResourceName may not be one of NVIDIA's device plugin (nvidia.com/gpu, nvidia.com/mig-1g.10gb,"
             " any name in the nvidia.com domain): pods asking for it expect what the device plugin gives, a whole"
             " GPU or a MIG device, on every node; use your own domain, e.g. example.com/gpu-slice",
             lambda s: s.extended_resource_name is None
             or re.match(NVIDIA_RESOURCE, s.extended_resource_name) is None, ".extendedResourceName"),
        Rule("self.slicing.mode != 'mig' || !has(self.tenants)"
             " || self.tenants.all(t, !has(t.maxSlices) && !has(t.maxFullGpus))",
             "in mig mode, limit tenants per MIG profile with tenants[].maxMigDevices, e.g."
             " {\"1g.10gb\": 4}; maxSlices and maxFullGpus are for memory and shared mode",
             lambda s: s.slicing.mode != "mig"
             or all(t.max_slices is None and t.max_full_gpus is None for t in s.tenants), ".tenants"),
        Rule("self.slicing.mode == 'mig' || !has(self.tenants) || self.tenants.all(t, !has(t.maxMigDevices))",
             "tenants[].maxMigDevices is for mig mode; in memory and shared mode use maxSlices (and"
             " maxFullGpus with allowFullGpu)",
             lambda s: s.slicing.mode == "mig" or all(t.max_mig_devices is None for t in s.tenants), ".tenants"),
        Rule("(self.slicing.mode == 'memory' && has(self.slicing.allowFullGpu) && self.slicing.allowFullGpu)"
             " || !has(self.tenants) || self.tenants.all(t, !has(t.maxFullGpus))",
             "tenants[].maxFullGpus needs slicing.allowFullGpu: true (memory mode): without it no whole"
             " GPU is offered",
             lambda s: (s.slicing.mode == "memory" and s.slicing.allow_full_gpu)
             or all(t.max_full_gpus is None for t in s.tenants), ".tenants"),
        Rule("!has(self.topology) || (self.slicing.mode == 'memory' && has(self.slicing.allowFullGpu)"
             " && self.slicing.allowFullGpu)",
             "topology offers claims of several whole GPUs: it needs slicing.mode: memory with allowFullGpu: true"
             " (a whole GPU is then a device of its own)",
             lambda s: s.topology is None or (s.slicing.mode == "memory" and s.slicing.allow_full_gpu), ".topology"),
        Rule("self.slicing.mode != 'mig' || !has(self.slicing.mig) || !has(self.tenants)"
             " || self.tenants.all(t, !has(t.maxMigDevices) || t.maxMigDevices.all(p,"
             " (has(self.slicing.mig.profiles) && p in self.slicing.mig.profiles)"
             " || (has(self.slicing.mig.layout) && p in self.slicing.mig.layout)))",
             "tenants[].maxMigDevices names a MIG profile the policy does not offer; use the profiles"
             " of slicing.mig.profiles or slicing.mig.layout",
             lambda s: s.slicing.mode != "mig" or s.slicing.mig is None or all(
                 set(t.max_mig_devices or {}) <= set(s.slicing.mig.profiles or []) | set(s.slicing.mig.layout or {})
                 for t in s.tenants), ".tenants"),
    )
