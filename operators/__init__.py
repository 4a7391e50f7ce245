"""kopf operator: an `LLMService` custom resource becomes an owned KubeRay `RayService`.

Layers: `spec` (typed resource), `crd` (the CRD, generated), `render` (the RayService, rendered by
the chart helm/llm-serving with Helm's engine from the spec's values), `status` (RayService status
+ metrics -> LLMService status), `kube` (API calls), and `llmservice` (the kopf handlers, thin over
the rest)."""
