// The control API: the hono app, its services over a node, the local server, and the client side.
export { type ApiServices, createApp, type MemberView } from "./app.ts";
export { apiBase, apiFetch } from "./client.ts";
export { ndjsonLine, readNdjson } from "./ndjson.ts";
export { type GenerateLine, readGenerateLines } from "./pipeline_routes.ts";
export { nodeServices } from "./services.ts";
export { type ApiServer, serveApi } from "./serve.ts";
