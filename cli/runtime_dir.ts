// A private XDG_RUNTIME_DIR for a process started without a usable one (containers, CI, `ssh host cmd`, the
// compiled binary run directly). Without one, the graphics stack behind WebGPU prints "error: XDG_RUNTIME_DIR
// is invalid or not set in the environment." twice whenever it enumerates adapters, though nothing is wrong.
// Set once at the start of the program, before any command runs, so every command of this machine resolves
// the same state folder (node/state_file.ts: $XDG_RUNTIME_DIR/swactor) whether it touches the GPU or not;
// the path is the one the ./swactor launcher sets (scripts/deno_env.sh), so launcher and binary agree.

/**
 * Sets XDG_RUNTIME_DIR to $TMPDIR/swactor-xdg-UID (made 0700) on Linux when it is unset or not a folder. A
 * folder of that name that is not ours alone (another owner, others may enter) is not used: a fresh private
 * temporary folder is. Returns the folder set, or undefined when nothing was changed. Never throws.
 */
export function ensureRuntimeDir(): string | undefined {
  if (Deno.build.os !== "linux") return undefined;
  const set = Deno.env.get("XDG_RUNTIME_DIR");
  if (set && isDir(set)) return undefined;
  try {
    const uid = Deno.uid() ?? 0;
    const dir = `${Deno.env.get("TMPDIR") || "/tmp"}/swactor-xdg-${uid}`;
    try {
      Deno.mkdirSync(dir, { mode: 0o700 });
    } catch (e) {
      if (!(e instanceof Deno.errors.AlreadyExists)) throw e;
    }
    const st = Deno.lstatSync(dir);
    const ours = st.isDirectory && st.uid === uid && ((st.mode ?? 0) & 0o077) === 0;
    const use = ours ? dir : Deno.makeTempDirSync({ prefix: "swactor-xdg-" });
    Deno.env.set("XDG_RUNTIME_DIR", use);
    return use;
  } catch {
    return undefined; // the warning is harmless: leave the environment as it is
  }
}

function isDir(path: string): boolean {
  try {
    return Deno.statSync(path).isDirectory;
  } catch {
    return false;
  }
}
