// Membership: SWIM with Lifeguard (after hashicorp/memberlist). The public face of node/membership/.
export {
  type DelegateHandle,
  type GossipDelegate,
  type MemberChange,
  Membership,
  type MembershipOptions,
  type MembershipStats,
} from "./swim.ts";
export { lan, local, type MembershipConfig, membershipConfig, presets, test, wan } from "./config.ts";
export {
  apply,
  type Member,
  type MemberEvent,
  type MemberState,
  type MemberTable,
  type NodeDescriptor,
  type NodeMeasurement,
} from "./state.ts";
export { decodePacket, isMembershipPacket, MAGIC, PROTOCOL_VERSION } from "./messages.ts";
export { suspicionTimeout, suspicionTimeouts } from "./suspicion.ts";
