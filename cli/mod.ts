// The list of commands, in the order `swactor --help` shows them.
import type { Command } from "./command.ts";

export const commands: Command[] = [];
