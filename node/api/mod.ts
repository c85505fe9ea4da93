// The control API: the hono app, its services over a node, the local server, and the client side.
export { type ApiOptions, type ApiServices, createApp, type MemberView } from "./app.ts";
export { apiError, apiFetch, type ApiTarget, apiTarget, targetOf } from "./client.ts";
export { type ApiGuard, newApiToken } from "./guard.ts";
export { BadRequestError, type GenerateRequest, parseGenerateRequest } from "./generate_request.ts";
export { DEFAULT_KV_TOKENS, KvBudget } from "./kv_budget.ts";
export { ndjsonLine, readNdjson } from "./ndjson.ts";
export { GENERATE_BODY_LIMIT, type GenerateLine, readGenerateLines } from "./pipeline_routes.ts";
export { nodeServices } from "./services.ts";
export { type ApiServer, serveApi } from "./serve.ts";
