package inventory

import (
	"context"
	"fmt"
	"net/url"
	"slices"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// AdoptMachine is an operator's yes to a parked report (a machine in
// CONFLICT, claims.go). Into the machine the report claimed to be (the
// default when that machine still exists), it moves the report: the
// machine takes the report's identity (serial, system UUID, baseboard
// serial and TPM key, exactly as reported), its facts (the difference on
// the fact history) and its boot MAC, and the parked record goes. With
// separate, or when the claimed machine is gone, the parked record becomes
// a machine of its own (INVENTORIED), renamed after its boot MAC when that
// name is free. Everything changes in one store transaction; the parked
// record's boot MAC must be its own or free (not another machine's), and
// a machine in INSTALLING is not adopted into.
func (i *Inventory) AdoptMachine(ctx context.Context, name string, separate bool) (*inventoryv1.Machine, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	now := timestamppb.New(i.cfg.Now())
	var out, parked *inventoryv1.Machine
	var writes []written
	_, err := record.RunTx(ctx, i.cfg.Store, func(tx *record.Tx) error {
		out, parked, writes = nil, nil, nil
		p, err := txMachine(ctx, tx, name)
		if err != nil {
			return err
		}
		if p == nil {
			return apierr.NotFoundf("machine %q", name)
		}
		if p.GetState() != inventoryv1.Machine_CONFLICT {
			return apierr.Preconditionf("machine %q is %s, not a parked report in CONFLICT", name, p.GetState())
		}
		parked = p
		boot := p.GetConflict().GetBootMac()
		var target *inventoryv1.Machine
		if n := p.GetConflict().GetMachine(); n != "" && !separate {
			if target, err = txMachine(ctx, tx, n); err != nil {
				return err
			}
		}
		if target == nil {
			target = proto.CloneOf(p)
			if err := Transition(target, EventAdopted); err != nil {
				return err
			}
			target.Conflict, target.StateReason = nil, "adopted as a machine of its own"
			if n := MachineNameForMAC(boot); n != name {
				other, err := txMachine(ctx, tx, n)
				if err != nil {
					return err
				}
				if other == nil {
					target.Name = n
				}
			}
		} else {
			if target.GetState() == inventoryv1.Machine_INSTALLING {
				return apierr.Preconditionf("machine %q is INSTALLING: adopt the report once its install ends", target.GetName())
			}
			target = proto.CloneOf(target)
			// The old identity's index records go; the report's come.
			if err := txUnindexIdentity(ctx, tx, target, identityKeys(held(p))); err != nil {
				return err
			}
			target.FactHistory = i.trimHistory(append(target.FactHistory, diffFacts(target.GetFacts(), p.GetFacts(), now)...))
			target.Facts = p.GetFacts()
			target.Serial, target.SystemUuid, target.BaseboardSerial, target.EkIdentity = p.GetSerial(), p.GetSystemUuid(), p.GetBaseboardSerial(), p.GetEkIdentity()
			if !slices.Contains(target.Macs, boot) {
				target.Macs = append(target.Macs, boot)
			}
			target.BootMac = boot
			if err := Transition(target, EventRegistered); err != nil {
				return err
			}
		}
		// The boot MAC: the parked record's, or free, or already the
		// target's; never another machine's.
		var b inventoryv1.MacBinding
		exists, err := tx.Get(ctx, macPrefix+boot, &b)
		if err != nil {
			return err
		}
		if exists && b.GetMachineName() != name && b.GetMachineName() != target.GetName() {
			if owner, err := txMachine(ctx, tx, b.GetMachineName()); err != nil {
				return err
			} else if owner != nil {
				return apierr.Preconditionf("MAC %s boots machine %s: adopt the report into %s or delete that machine first", boot, owner.GetName(), owner.GetName())
			}
		}
		if err := tx.Put(macPrefix+boot, &inventoryv1.MacBinding{MachineName: target.GetName()}); err != nil {
			return err
		}
		target.BootMac = boot
		if !slices.Contains(target.Macs, boot) {
			target.Macs = append(target.Macs, boot)
		}
		if target.GetName() != name || target.GetState() != inventoryv1.Machine_CONFLICT {
			if target.GetName() != name {
				if err := tx.Delete(machinePrefix + name); err != nil {
					return err
				}
				writes = append(writes, written{name, nil})
			}
		}
		// The report's identity is indexed to the target unless another
		// machine holding the same identifier has it.
		reg := &registration{i: i, id: held(target)}
		flags, err := reg.index(ctx, tx, target.GetName())
		if err != nil {
			return err
		}
		writes = append(writes, reg.written...)
		target.Flags = mergeFlags(target.GetFlags(), flags)
		target.UpdatedAt = now
		if err := tx.Put(machinePrefix+target.GetName(), target); err != nil {
			return err
		}
		writes = append(writes, written{target.GetName(), target})
		out = target
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, w := range writes {
		i.observe(w.name, w.m)
	}
	detail := fmt.Sprintf("parked report %s adopted as machine %s", name, out.GetName())
	attrs := map[string]string{"parked": name, "machine": out.GetName(), "claimed": parked.GetConflict().GetMachine()}
	i.Event(parked.GetConflict().GetBootMac(), "inventory", "adopted", detail, attrs)
	if mac := firstMAC(out); mac != "" && mac != parked.GetConflict().GetBootMac() {
		i.Event(mac, "inventory", "adopted", detail, attrs)
	}
	i.log.Info("parked report adopted", "parked", name, "machine", out.GetName(), "mac", parked.GetConflict().GetBootMac())
	return out, nil
}

// RejectMachine is an operator's no to a parked report: the record in
// CONFLICT and the MAC binding it holds are deleted (one transaction).
// The report's MAC boots discovery again; a machine that keeps making the
// same claim is parked again.
func (i *Inventory) RejectMachine(ctx context.Context, name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	var parked *inventoryv1.Machine
	_, err := record.RunTx(ctx, i.cfg.Store, func(tx *record.Tx) error {
		p, err := txMachine(ctx, tx, name)
		if err != nil {
			return err
		}
		if p == nil {
			return apierr.NotFoundf("machine %q", name)
		}
		if p.GetState() != inventoryv1.Machine_CONFLICT {
			return apierr.Preconditionf("machine %q is %s, not a parked report in CONFLICT: delete it instead", name, p.GetState())
		}
		parked = p
		if err := tx.Delete(machinePrefix + name); err != nil {
			return err
		}
		// A parked record holds no identity index records; its MAC
		// binding, when it has one, goes.
		for _, mac := range p.GetMacs() {
			var b inventoryv1.MacBinding
			exists, err := tx.Get(ctx, macPrefix+mac, &b)
			if err != nil {
				return err
			}
			if exists && b.GetMachineName() == name {
				if err := tx.Delete(macPrefix + mac); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	i.observe(name, nil)
	c := parked.GetConflict()
	i.Event(c.GetBootMac(), "inventory", "rejected", fmt.Sprintf("parked report %s rejected (it claimed machine %s: %s)", name, c.GetMachine(), c.GetReason()), map[string]string{"parked": name, "claimed": c.GetMachine()})
	i.log.Info("parked report rejected", "parked", name, "mac", c.GetBootMac(), "claimed", c.GetMachine())
	return nil
}

// identityKeys are the serial, UUID and TPM key index records of id.
func identityKeys(id identity) []string {
	var keys []string
	if id.serial != "" {
		keys = append(keys, serialPrefix+url.PathEscape(id.serial))
	}
	if id.uuid != "" {
		keys = append(keys, uuidPrefix+id.uuid)
	}
	if id.ek != "" {
		keys = append(keys, ekPrefix+id.ek)
	}
	return keys
}

// txUnindexIdentity deletes in tx the serial, UUID and TPM key index
// records that name m (not its MAC bindings), except those in keep.
func txUnindexIdentity(ctx context.Context, tx *record.Tx, m *inventoryv1.Machine, keep []string) error {
	for _, k := range identityKeys(held(m)) {
		if slices.Contains(keep, k) {
			continue
		}
		var b inventoryv1.MacBinding
		exists, err := tx.Get(ctx, k, &b)
		if err != nil {
			return err
		}
		if exists && b.GetMachineName() == m.GetName() {
			if err := tx.Delete(k); err != nil {
				return err
			}
		}
	}
	return nil
}
