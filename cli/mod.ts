// The list of commands, in the order `swactor --help` shows them.
import type { Command } from "./command.ts";
import { down } from "./down.ts";
import { join } from "./join.ts";
import { status } from "./status.ts";
import { up } from "./up.ts";

export const commands: Command[] = [up, join, status, down];
