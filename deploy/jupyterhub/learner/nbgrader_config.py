"""nbgrader in a learner's server on the hub: the shared exchange only (never the course)."""

import os

c = get_config()  # noqa: F821 - provided by traitlets when this file is loaded

c.CourseDirectory.course_id = "pallas-course"
c.Exchange.root = os.environ["PALLAS_COURSE_EXCHANGE"]
c.Exchange.path_includes_course = True
# the hub's user name is the student id, whatever Unix user the server runs as (a container's
# jovyan, or one account for all in a test)
c.CourseDirectory.student_id = os.environ["JUPYTERHUB_USER"]
# the inbound entry stays the learner's and the instructors' (mode 2770), not nbgrader's 0777
c.ExchangeFactory.submit = "grader.logistics.inbound.PrivateSubmit"
# the exchange's root is the administrator's (deploy/setup-class.sh), not 0777: with groupshared,
# nbgrader does not try to make it so (which fails, and then offers no assignments)
c.CourseDirectory.groupshared = True
