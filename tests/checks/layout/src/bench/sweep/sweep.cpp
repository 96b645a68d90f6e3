// planted
