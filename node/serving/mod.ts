// The leader's HTTP server: the OpenAI-compatible API, the dashboard and /metrics. See docs/SERVING.md.
export { Activity, type RequestRecord } from "./activity.ts";
export { Admission, type AdmissionOptions } from "./admission.ts";
export { createServingApp, SERVING_BODY_LIMIT, type ServingOptions } from "./app.ts";
export { DEFAULT_CHAT_TOKENS, DEFAULT_COMPLETION_TOKENS } from "./completion.ts";
export { ApiError, type ErrorBody } from "./errors.ts";
export { type ServingGuard } from "./guard.ts";
export { type CompletionJob, parseChatRequest, parseCompletionRequest } from "./openai_request.ts";
export { type ClusterView, pipelineServing, type ServedModel, type ServingServices } from "./services.ts";
export { StopMatcher } from "./stop_strings.ts";
