// Name registry: actor name -> owner node, replicated over membership. Public face of node/registry/.
export {
  type NameSetView,
  Registry,
  type RegistryHost,
  type RegistryOptions,
  type Watcher,
} from "./registry.ts";
export { nameInSet, parseSetName, type Ranges } from "./name_set.ts";
export { type Entry, newer } from "./entry.ts";
