import { HOST_METADATA, MODULE_PATH, PATH_METADATA, VERSION_METADATA } from '@nestjs/common/constants.js';

/** Metadata of @nestjs/websockets, read by name: the library depends on no transport package. */
const GATEWAY_OPTIONS = 'websockets:gateway_options';
const GATEWAY_PORT = 'port';

/** Characters a scope suffix keeps; any other becomes `_` (a draft-8 name is a quoted string, a key is text). */
const UNSAFE = /[^A-Za-z0-9._:@/;=,*~-]/g;

/**
 * What tells apart the routes of classes that share a name, added to their unnamed scopes
 * (`UsersController.list@/v2/users`). Only a class whose name another limited class also has gets one,
 * so a unique class keeps `Controller.handler` and its keys. Built from what the code declares (module
 * paths of RouterModule, the controller's path, version and host; a gateway's port and namespace), so
 * every instance and every deploy of the same code computes the same text.
 *
 * `registrations`: each class with the modules that register it (one class in two modules is one class).
 * Classes whose text is the same as another's of their name keep it: the registry's check of unnamed
 * scopes then stops start-up, naming both.
 */
export function scopeSuffixes(registrations: ReadonlyMap<Function, readonly Function[]>, applicationId: string): Map<Function, string> {
  const byName = new Map<string, Function[]>();
  for (const type of registrations.keys()) byName.set(type.name, [...(byName.get(type.name) ?? []), type]);
  const suffixes = new Map<Function, string>();
  for (const types of byName.values()) {
    if (types.length < 2) continue;
    for (const type of types) suffixes.set(type, whereRoutesAre(type, registrations.get(type) ?? [], applicationId));
  }
  return suffixes;
}

function whereRoutesAre(type: Function, modules: readonly Function[], applicationId: string): string {
  let text = '';
  const gateway: { namespace?: unknown } | undefined = Reflect.getMetadata(GATEWAY_OPTIONS, type);
  if (gateway !== undefined) {
    const port: unknown = Reflect.getMetadata(GATEWAY_PORT, type);
    text = `@ws${port ? `:${String(port)}` : ''}/${gateway.namespace === undefined ? '' : String(gateway.namespace).replace(/^\//, '')}`;
  } else if (Reflect.hasMetadata(PATH_METADATA, type)) {
    // RouterModule's path of each module registering the class (read as Nest's RoutesResolver reads it).
    const modulePath = (module: Function): string =>
      Reflect.getMetadata(MODULE_PATH + applicationId, module) ?? Reflect.getMetadata(MODULE_PATH, module) ?? '';
    const modulePaths = modules.length > 0 ? modules.map(modulePath) : [''];
    const paths = [Reflect.getMetadata(PATH_METADATA, type)].flat().map(String);
    const full = new Set(modulePaths.flatMap((modulePath: string) => paths.map((path) => normalize(`${modulePath}/${path}`))));
    text = `@${[...full].sort().join(',')}`;
    const version: unknown = Reflect.getMetadata(VERSION_METADATA, type);
    if (version !== undefined) text += `;v=${[version].flat().map(versionText).join(',')}`;
    const host: unknown = Reflect.getMetadata(HOST_METADATA, type);
    if (host !== undefined) text += `;host=${[host].flat().map(String).join(',')}`;
  }
  return text.replace(UNSAFE, '_');
}

function normalize(path: string): string {
  const joined = `/${path}`.replace(/\/+/g, '/');
  return joined.length > 1 ? joined.replace(/\/$/, '') : joined;
}

function versionText(version: unknown): string {
  return typeof version === 'symbol' ? 'neutral' : String(version);
}
