"""What several files of the TensorFlow adapter share."""
from __future__ import annotations

SILENT = " (TF itself would copy them silently)"
