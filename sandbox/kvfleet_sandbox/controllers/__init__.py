"""Simulated controllers of the sandbox. Each module exposes ``attach(twin: ClusterTwin) -> Controller`` and
is attached, in the order of ``CONTROLLER_MODULES``, to every cluster twin by ``kvfleet_sandbox.runtime``."""

CONTROLLER_MODULES = ("workloads", "operator", "kyverno", "curvine", "vllm")
# Controller name (what ``start_sandbox(controllers=...)`` and the tests say) -> its module in this package, where
# they differ: the inference operator lives in ``inference_operator`` so that no module shadows the standard
# library's ``operator`` when ``plugins/`` is on sys.path.
MODULE_NAMES = {"operator": "inference_operator"}
