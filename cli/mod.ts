// The list of commands, in the order `swactor --help` shows them.
import type { Command } from "./command.ts";
import { planCommand } from "./plan.ts";

export const commands: Command[] = [planCommand];
