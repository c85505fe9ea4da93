// Adapts a running node to the control API's services.
import type { SwactorNode } from "../node.ts";
import type { ApiServices, MemberView } from "./app.ts";
import type { PipelineNode } from "../stage/mod.ts";
import { CLIENT_PREFIX } from "../stage/client.ts";
import { descriptorView } from "../descriptor.ts";

export function nodeServices(
  node: SwactorNode,
  opts: { plan?: unknown; down: () => void; pipeline?: () => PipelineNode | undefined },
): ApiServices {
  return {
    self: () => node.membership.id,
    members: () => {
      const roles = new Map<string, string[]>();
      // Expert sets read as one role per layer: "experts L:a-b,c-d" (a host owns ranges, not names).
      for (const set of node.registry.sets()) {
        for (const [layer, ranges] of Object.entries(set.groups)) {
          if (ranges.length === 0) continue;
          const ids = ranges.map(([a, b]) => (b - a === 1 ? `${a}` : `${a}-${b - 1}`)).join(",");
          roles.set(set.owner, [...(roles.get(set.owner) ?? []), `experts ${layer}:${ids}`]);
        }
      }
      for (const [name, owner] of node.registry.entries()) {
        if (name.startsWith(CLIENT_PREFIX) || name.startsWith("moe-host-")) continue; // plumbing, not roles
        roles.set(owner, [...(roles.get(owner) ?? []), name]);
      }
      const host = Deno.hostname();
      return node.membership.members().map((m): MemberView => {
        const path = node.transport.dataPath?.(m.id); // none for this node: it has no link to itself
        return {
          ...(m.meta.pid && m.meta.name === host ? { pid: m.meta.pid } : {}),
          ...(path ? { dataPath: path } : {}),
          id: m.id,
          state: m.state,
          roles: roles.get(m.id) ?? [],
          name: m.meta.name,
          addrs: m.addrs,
          adapter: m.meta.adapter,
          gpuMemoryBytes: m.meta.gpuMemoryBytes,
          version: m.meta.version,
          descriptor: descriptorView(m, node.links),
        };
      }).sort((a, b) => (a.id < b.id ? -1 : 1));
    },
    registry: () => node.registry.entries(),
    plan: () => opts.plan ?? null,
    down: opts.down,
    pipeline: opts.pipeline,
    loop: () => node.loop?.stats(),
  };
}
