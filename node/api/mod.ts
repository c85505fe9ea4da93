// The control API: the hono app, its services over a node, and the local server.
export { type ApiServices, createApp, type MemberView } from "./app.ts";
export { nodeServices } from "./services.ts";
export { type ApiServer, serveApi } from "./serve.ts";
