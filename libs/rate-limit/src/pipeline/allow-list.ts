import { BlockList, isIP } from 'node:net';

/**
 * `allowList.ips` as a `BlockList`: addresses and CIDR ranges of both families. Node's `BlockList`
 * matches an IPv4-mapped IPv6 address (`::ffff:10.1.2.3`) against IPv4 rules, as the limiter's IP
 * identity does.
 */
export class AddressList {
  private readonly list = new BlockList();
  readonly empty: boolean;

  constructor(entries: readonly string[]) {
    for (const entry of entries) {
      const [address, bits] = entry.split('/');
      const family = isIP(address) === 4 ? 'ipv4' : 'ipv6';
      if (bits === undefined) this.list.addAddress(address, family);
      else this.list.addSubnet(address, Number(bits), family);
    }
    this.empty = entries.length === 0;
  }

  /** Whether a client address (as `req.ip` gives it: possibly with a port, brackets or a zone) is listed. */
  has(address: string | undefined): boolean {
    if (this.empty || !address) return false;
    const host = hostOf(address);
    const family = isIP(host);
    if (family === 0) return false;
    return this.list.check(host, family === 4 ? 'ipv4' : 'ipv6');
  }
}

/** The address without a port (`a.b.c.d:port`, `[v6]:port`), brackets or an IPv6 zone (`%eth0`). */
function hostOf(address: string): string {
  const v4 = /^(\d{1,3}(?:\.\d{1,3}){3}):\d{1,5}$/.exec(address);
  if (v4) return v4[1];
  const v6 = /^\[([^\]]+)\](?::\d{1,5})?$/.exec(address);
  return (v6 ? v6[1] : address).split('%')[0];
}
