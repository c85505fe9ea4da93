// The list of commands, in the order `swactor --help` shows them.
import type { Command } from "./command.ts";
import { generateCommand } from "./generate.ts";
import { logitsCommand } from "./logits.ts";
import { planCommand } from "./plan.ts";

export const commands: Command[] = [generateCommand, logitsCommand, planCommand];
