// Name registry: actor name -> owner node, replicated over membership. Public face of node/registry/.
export { Registry, type RegistryHost, type RegistryOptions, type Watcher } from "./registry.ts";
export { type Entry, newer } from "./entry.ts";
