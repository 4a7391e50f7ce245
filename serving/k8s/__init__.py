"""What a Kubernetes cluster runs, generated from PlatformConfig: the RayService's serve config
(`serve_config`), the chart's values schema (`values_schema`), the chart rendered with Helm's own
engine (`chart`) and the `llm-serving render` commands (`cli`). Nothing here calls a cluster."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "helm" / "llm-serving"
