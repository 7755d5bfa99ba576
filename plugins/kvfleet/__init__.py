"""kvfleet: roll a tiered KV cache (vLLM HBM -> LMCache DRAM -> Curvine NVMe) across a HyperPod fleet.

The package is layered (see ARCHITECTURE in the README): ``fleet`` decides, ``clients`` talk to outside
systems, ``history`` records, ``stages`` reconcile, ``airflow`` wires them into Airflow, and ``sandbox`` is
the digital twin that stands behind the same wires in tests and the demo.
"""

__version__ = "0.1.0"
