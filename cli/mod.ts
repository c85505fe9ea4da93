// The list of commands, in the order `swactor --help` shows them.
import type { Command } from "./command.ts";
import { down } from "./down.ts";
import { generateCommand } from "./generate.ts";
import { join } from "./join.ts";
import { logitsCommand } from "./logits.ts";
import { planCommand } from "./plan.ts";
import { status } from "./status.ts";
import { up } from "./up.ts";

export const commands: Command[] = [generateCommand, logitsCommand, up, join, status, down, planCommand];
