"""Keelson's moto server: `python -c <this> -H HOST -p PORT`, i.e. `moto.server` with the fixes below,
each where moto differs from AWS's documented behaviour. Tests that need a fix assert it, so each one
has a test that fails without it.

1. Instances launched from a launch template carry the template's IAM instance profile.
   AWS: RunInstances with a LaunchTemplate (and every Auto Scaling launch from one) gives the instance
   the template's `IamInstanceProfile` (DescribeInstances shows `IamInstanceProfile.Arn`). moto drops
   it, so instances show none. Test: protokube/tests/node_join.rs
   `moto_instances_of_a_launch_template_carry_its_instance_profile` (the node-join server checks
   that a joining instance carries its group's profile).
"""
import sys

from moto.ec2.models.instances import InstanceBackend

_run_instances = InstanceBackend.run_instances


def _run_instances_with_template_profile(self, image_id, count, user_data, security_group_names, **kwargs):
    reservation = _run_instances(self, image_id, count, user_data, security_group_names, **kwargs)
    template = kwargs.get("launch_template")
    explicit = kwargs.get("iam_instance_profile_name") or kwargs.get("iam_instance_profile_arn")
    if template and not explicit:
        profile = self._get_template_from_args(template).data.get("IamInstanceProfile") or {}
        name, arn = profile.get("Name"), profile.get("Arn")
        if name or arn:
            for instance in reservation.instances:
                if instance.id not in self.iam_instance_profile_associations:
                    self.associate_iam_instance_profile(
                        instance_id=instance.id, iam_instance_profile_name=name, iam_instance_profile_arn=arn
                    )
    return reservation


InstanceBackend.run_instances = _run_instances_with_template_profile

if __name__ == "__main__":
    from moto.server import main

    sys.argv[0] = "moto_server"
    main(sys.argv[1:])
