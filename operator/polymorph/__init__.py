"""Polymorph control plane: API models, CRD generation, artifact store and the operator.

This package never imports torch; the data plane lives in ``polymorph_engine``.
"""

__version__ = "0.1.0"
