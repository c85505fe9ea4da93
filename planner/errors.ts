// The one error callers of the planner handle: no placement satisfies the inputs.

/** No placement fits; `constraint` names what fails (memory of a node, a pin, total memory, ...). */
export class PlacementError extends Error {
  override name = "PlacementError";
  constructor(readonly constraint: string, message: string) {
    super(message);
  }
}
