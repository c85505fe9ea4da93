// The Assignment board over simulated membership: a member that missed the leader's push of a new
// Assignment fetches it as soon as the news reaches it, instead of waiting for a periodic push-pull.
import assert from "node:assert/strict";
import { lan } from "../../../node/membership/mod.ts";
import { AssignmentBoard } from "../../../node/stage/mod.ts";
import { SimCluster } from "../../support/sim_cluster.ts";

Deno.test("a member whose push from the leader was lost gets the Assignment within seconds", () => {
  for (const seed of [1, 2, 3]) {
    const c = new SimCluster({ n: 8, config: lan, seed });
    c.joinAll();
    assert.ok(c.clock.runUntilTrue(() => c.converged(), { stepMs: 50, maxMs: 60_000 }) !== undefined);
    const boards = c.nodes.map((n) => new AssignmentBoard(n.membership));
    const [leader, victim] = [c.nodes[0], c.nodes[5]];
    // Everything from the leader to the victim is lost for the first second after the publication.
    c.net.setLink(leader.id, victim.id, { loss: 1 }, { oneWay: true });
    const stages = [{
      index: 0,
      node: leader.id,
      layers: [0, 1] as [number, number],
      embeds: true,
      head: true,
    }];
    boards[0].publish({ plan: { stages }, model: { dir: "m", weights: "f32" }, layers: 1 });
    c.clock.advance(1000);
    c.net.setLink(leader.id, victim.id, { loss: 0 }, { oneWay: true });
    const t = c.clock.runUntilTrue(() => boards.every((b) => b.current !== undefined), {
      stepMs: 20,
      maxMs: 60_000,
    });
    assert.ok(
      t !== undefined && t <= 4000,
      `seed ${seed}: every member had it ${t} ms after the link came back`,
    );
  }
});
