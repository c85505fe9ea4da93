// NDJSON, the body of the API's streaming replies (`POST /generate`): one JSON value per line, each line
// ending in "\n". The route writes lines with ndjsonLine; a client reads them back with readNdjson.

const enc = new TextEncoder();

/** One value as an NDJSON line (JSON.stringify escapes newlines inside strings, so a value is one line). */
export function ndjsonLine(value: unknown): Uint8Array {
  return enc.encode(JSON.stringify(value) + "\n");
}

/**
 * Yields each line's value, in order, as the body arrives. Blank lines are skipped; a last line without its
 * "\n" is taken when it is whole. Throws an Error naming the line when one is not JSON (a stream cut inside
 * a line included). Stopping early (break, return) cancels the body.
 */
export async function* readNdjson(body: ReadableStream<Uint8Array>): AsyncGenerator<unknown> {
  let buf = "";
  let n = 0;
  const parse = (line: string, last: boolean) => {
    try {
      return JSON.parse(line);
    } catch (e) {
      const why = last ? "the stream ended inside it: " : "";
      throw new Error(`NDJSON: line ${n} is not JSON (${why}${(e as Error).message}): ${line.slice(0, 80)}`);
    }
  };
  for await (const chunk of body.pipeThrough(new TextDecoderStream())) {
    buf += chunk;
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      n++;
      if (line.trim() !== "") yield parse(line, false);
    }
  }
  n++;
  if (buf.trim() !== "") yield parse(buf, true);
}
