package netplumb

import (
	"errors"
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Instances seen from outside: for sweeping the plumbing of an instance
// whose process is gone (a `warren run` killed with SIGKILL), which no
// Host holds any more. Which instances are gone is the caller's to say.

// Tables lists the instances whose tables' names begin with prefix.
func Tables(prefix string) ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("netplumb: nftables: %w", err)
	}
	ts, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("netplumb: list tables: %w", err)
	}
	var out []string
	for _, t := range ts {
		if strings.HasPrefix(t.Name, prefix) {
			out = append(out, t.Name)
		}
	}
	return out, nil
}

// RemoveInstance deletes the instance prefix's veths and then its table:
// Host.Remove for an instance no Host holds. Its sandboxes lose their
// link. What is already gone is no error.
func RemoveInstance(prefix string) error {
	cfg := Config{Prefix: prefix, Pool: DefaultPool, MaxConns: 1, ResolverPort: 1, ProxyPort: 2}
	if err := cfg.Validate(); err != nil {
		return err
	}
	links, err := consistent(netlink.LinkList)
	if err != nil {
		return fmt.Errorf("netplumb: remove %s: %w", prefix, err)
	}
	var errs []error
	vp := VethPrefixOf(prefix)
	for _, link := range links {
		a := link.Attrs()
		if !strings.HasPrefix(a.Name, vp) || !strings.HasPrefix(a.Alias, prefix+" ") {
			continue
		}
		if err := netlink.LinkDel(link); err != nil && !notFound(err) {
			errs = append(errs, fmt.Errorf("delete %s: %w", a.Name, err))
		}
	}
	c, err := nftables.New()
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("netplumb: nftables: %w", err))...)
	}
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: prefix})
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("delete table %s: %w", prefix, err))
	}
	if len(errs) > 0 {
		return fmt.Errorf("netplumb: remove %s: %w", prefix, errors.Join(errs...))
	}
	return nil
}
