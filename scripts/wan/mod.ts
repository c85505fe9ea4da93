// WAN emulation for swactor (docs/WAN.md): user-space UDP relays that add delay, jitter, loss and a rate
// cap between iroh endpoints, the topology helper that places them between the nodes of a chain, and
// the network namespaces that keep iroh from going around them.
export { admit, createLink, type LinkSpec, type LinkState, normalizeLink } from "./link.ts";
export { type DirectionStats, type Relay, type RelayOptions, type RelayStats, startRelay } from "./relay.ts";
export {
  type ChainOptions,
  type LinkDef,
  startChain,
  startTopology,
  type Topology,
  type TopologyOptions,
  type TopologyRelay,
} from "./topology.ts";
export { cleanupNetns, createNetns, type NetnsNode, type NetnsOptions, type NetnsSet } from "./netns.ts";
