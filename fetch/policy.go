package fetch

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
)

// ErrAddressDenied means the upstream address policy refused a connection:
// nothing was sent.
var ErrAddressDenied = errors.New("address refused by the upstream address policy")

// DeniedByDefault are the ranges no upstream connection reaches unless an
// allow rule as specific or more says otherwise: link-local (where cloud
// metadata services answer: 169.254.169.254, and fd00:ec2::254 on AWS),
// and the unspecified addresses, which reach the host itself. Loopback is
// allowed by default: the simulator, the demo and tests serve there; an
// operator denies it with 127.0.0.0/8 and ::1/128.
var DeniedByDefault = []string{"169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128", "0.0.0.0/8", "::/128"}

// AddrPolicy decides which addresses upstream connections may reach: the
// most specific rule (longest prefix) that holds an address decides, a
// deny winning a tie; an address no rule holds is allowed. So an allow of
// 169.254.10.0/24 opens that much of link-local, and a deny of 0.0.0.0/0
// and ::/0 with allows for a few networks is an allow list.
type AddrPolicy struct {
	rules []rule
}

type rule struct {
	prefix netip.Prefix
	allow  bool
}

// DefaultPolicy is the policy of DeniedByDefault alone.
func DefaultPolicy() *AddrPolicy {
	p, err := NewPolicy(nil, nil)
	if err != nil {
		panic(err) // the built-in ranges parse
	}
	return p
}

// NewPolicy returns DeniedByDefault plus allow and deny, CIDR prefixes
// ("10.0.0.0/8", "2001:db8::/32") or single addresses.
func NewPolicy(allow, deny []string) (*AddrPolicy, error) {
	p := &AddrPolicy{}
	add := func(list []string, allowed bool, what string) error {
		for _, s := range list {
			pr, err := parsePrefix(s)
			if err != nil {
				return fmt.Errorf("%s %q: %w", what, s, err)
			}
			p.rules = append(p.rules, rule{prefix: pr, allow: allowed})
		}
		return nil
	}
	if err := add(DeniedByDefault, false, "built-in deny"); err != nil {
		return nil, err
	}
	if err := add(deny, false, "deny"); err != nil {
		return nil, err
	}
	if err := add(allow, true, "allow"); err != nil {
		return nil, err
	}
	return p, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, errors.New("not a CIDR prefix or an IP address")
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	pr, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, errors.New("not a CIDR prefix or an IP address")
	}
	if pr.Addr().Is4In6() && pr.Bits() >= 96 {
		pr = netip.PrefixFrom(pr.Addr().Unmap(), pr.Bits()-96)
	}
	return pr.Masked(), nil
}

// Allows reports whether a connection to addr may be made, and which rule
// refused it when not.
func (p *AddrPolicy) Allows(addr netip.Addr) (bool, string) {
	addr = addr.Unmap().WithZone("")
	best, allowed, by := -1, true, ""
	for _, r := range p.rules {
		if !r.prefix.Contains(addr) {
			continue
		}
		if b := r.prefix.Bits(); b > best || b == best && !r.allow {
			best, allowed, by = b, r.allow, r.prefix.String()
		}
	}
	return allowed, by
}

// control is the dialer's Control: it sees the address being connected
// to, after resolution, for every connection.
func (p *AddrPolicy) control(network, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrAddressDenied, address, err)
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("%w: %s is not an IP address", ErrAddressDenied, host)
	}
	if ok, by := p.Allows(addr); !ok {
		return fmt.Errorf("%w: %s is in %s", ErrAddressDenied, addr.WithZone(""), by)
	}
	return nil
}
