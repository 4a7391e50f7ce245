"""What a Kubernetes cluster runs, generated from PlatformConfig: the RayService's serve config
(`serve_config`), the chart's values schema (`values_schema`), the chart rendered with Helm's own
engine (`chart`) and the `llm-serving render` commands (`cli`). Nothing here calls a cluster."""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# An installed package has no repository around it: the images copy the chart (the operator
# renders it) and name it here.
CHART_DIR_ENV = "LLM_SERVING_CHART_DIR"
CHART_DIR = Path(os.environ.get(CHART_DIR_ENV) or REPO_ROOT / "helm" / "llm-serving")
